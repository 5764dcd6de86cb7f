"""`archspec ablate SWEEP --status`: where each variant of a sweep stands, from the registry alone."""

from __future__ import annotations

from rich.table import Table

COLUMNS = (("queued", ("SCHEDULED",)), ("running", ("RUNNING",)), ("finished", ("FINISHED",)),
           ("failed", ("FAILED", "KILLED")))


def sweep_status(registry, sweep_name: str, sweep=None, only: set[str] | None = None,
                 title: str | None = None) -> tuple[Table, dict[int, dict[str, int]]]:
    """A table of the sweep's variants × (queued, running, finished, failed) counts, and the counts. A RUNNING run
    whose heartbeat is stale counts as failed (its process died; the next write reaps it KILLED)."""
    from archspec.ablate.runner import collect
    from archspec.registry.query.parse import text_literal

    variants, baseline = collect(registry, sweep_name, sweep, only=only)
    rows = {r.id: r for r in registry.runs(where=f"sweep = {text_literal(sweep_name)}")}
    stale = {i for i, r in rows.items() if getattr(r, "stale", False)}
    counts: dict[int, dict[str, int]] = {}
    table = Table(title=f"sweep {sweep_name}" + (f" ({title})" if title else "") + ": status from the registry",
                  title_justify="left")
    for col in ("variant", "label", *(c for c, _ in COLUMNS), "jobs"):
        table.add_column(col, justify="left" if col in ("variant", "label", "jobs") else "right", overflow="fold")
    for v in variants:
        c = {name: 0 for name, _ in COLUMNS}
        for r in v.runs:
            status = "FAILED" if r.run_id in stale else r.status
            for name, statuses in COLUMNS:
                if status in statuses:
                    c[name] += 1
        counts[v.index] = c
        jobs = sorted({rows[r.run_id].scheduler_job for r in v.runs
                       if r.run_id in rows and rows[r.run_id].scheduler_job})
        table.add_row(f"v{v.index}" + (" (baseline)" if v.index == baseline else ""), v.label,
                      *(str(c[name]) for name, _ in COLUMNS), ", ".join(jobs) or "-")
    return table, counts
