"""Sparse attention: the machinery behind `sparse_attention(q, k, v, PATTERN)` in a generated model file.

A pattern is a predicate, `mask_mod(b, h, q_idx, kv_idx)` (FlexAttention's convention: tensors of positions in,
booleans out), plus what the fast paths need to gather only the keys it can see. Masking a dense T×T score matrix
would give the same answer at the full O(T²) cost; here time and memory fall with the pattern's density.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# logit_observers: the one list of attention-logit observers, shared with score_mod_attention (archspec.runtime.scores)
from archspec.runtime.scores import alibi_bias, capped, logit_observers, score_mod_attention, sink_softmax  # noqa: F401


class SparsePattern:
    """Which keys each query sees: `mask_mod` decides; `n_global` leading positions may be seen from anywhere (later
    queries only: attention stays causal); every other visible key lies within the `reach` positions that end at the
    query (itself included), and in a band reaching `lookback` positions before the first query of its chunk, `chunk`
    queries that start at a multiple of `chunk`."""

    def __init__(self, mask_mod, n_global: int, lookback: int, chunk: int, reach: int) -> None:
        self.mask_mod, self.n_global, self.lookback, self.chunk = mask_mod, n_global, lookback, chunk
        self.reach = reach


class RollingKVCache:
    """A sparse layer's keys and values for generation, holding only what its pattern can still show a later query:
    the pattern's `n_global` leading positions, kept for good, then a ring buffer of the last `reach` positions (plus
    `rollback`), in which each new position overwrites the oldest. A window layer's cache thus stays its window
    however long the sequence grows. N_KV_HEADS heads (not N_HEADS), like KVCache; `max_len` positions at most."""

    def __init__(self, pattern: SparsePattern, batch_size: int, n_kv_heads: int, max_len: int, head_dim: int,
                 rollback: int = 0, device=None, dtype=None, v_dim: int | None = None) -> None:
        self.pattern, self.max_len = pattern, max_len
        size = min(pattern.n_global + pattern.reach + rollback, max_len)  # slots; a short sequence never wraps
        self.n_global = min(pattern.n_global, size)  # slot p < n_global holds position p
        self.ring = size - self.n_global  # position p >= n_global lives in slot n_global + (p - n_global) % ring
        shape = (batch_size, n_kv_heads, size, head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)  # (B, n_kv_heads, slots, head_dim)
        self.v = torch.zeros(shape[:-1] + (head_dim if v_dim is None else v_dim,), device=device, dtype=dtype)
        self.pos = torch.full((size,), -1, dtype=torch.long, device=device)  # each slot's position; -1: empty
        self.length = 0  # positions seen: the position of the next token
        self.oldest = self.n_global  # the oldest position the ring still holds

    def _slots(self, positions: torch.Tensor) -> torch.Tensor:
        ring = positions - self.n_global
        return torch.where(ring < 0, positions, self.n_global + ring.remainder(max(self.ring, 1)))

    def _store(self, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write T new positions' k, v (B, n_kv_heads, T, head_dim): the globals among them, and as many of the
        newest as the ring holds (older ones would be overwritten by the newer within this very write)."""
        start, end, device = self.length, self.length + k.size(2), self.k.device
        globals_end = max(start, min(end, self.n_global))  # positions start .. globals_end - 1 are global
        first = min(end, max(start, self.n_global, end - self.ring))  # the oldest this write puts in the ring
        positions = torch.cat([torch.arange(start, globals_end, device=device),
                               torch.arange(first, end, device=device)])  # (n,)
        slots = self._slots(positions)
        self.k.index_copy_(2, slots, k.index_select(2, positions - start))
        self.v.index_copy_(2, slots, v.index_select(2, positions - start))
        self.pos.index_copy_(0, slots, positions)
        self.length, self.oldest = end, max(self.oldest, end - self.ring)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scale: float | None = None,
               softcap: float | None = None, alibi: torch.Tensor | None = None,
               sinks: torch.Tensor | None = None) -> torch.Tensor:
        """This step's q (B, N_HEADS, T, D) and k, v (B, N_KV_HEADS, T, D), positions `length` onwards: store k, v and
        return the attention output (B, N_HEADS, T, D) over every visible key, cached or new (scale, softcap, alibi,
        sinks: as sparse_attention's; ALiBi's bias from each slot's absolute position, so cached == full)."""
        start, T = self.length, q.size(2)
        end = start + T
        if end > self.max_len:
            raise ValueError(f"KV cache full: {end} positions, made for {self.max_len}")
        if start == 0:  # prefill: positions 0..T-1, as in training (the sparse fast path)
            y = sparse_attention(q, k, v, self.pattern, scale=scale, softcap=softcap, alibi=alibi,
                                 sinks=sinks)  # (B, N_HEADS, T, D)
            self._store(k, v)
            return y
        # The first query sees keys from start - reach + 1 on (and the globals). When this step's writes evict none of
        # those (one token at a time does not), write first and attend over the slots alone; else over slots + new.
        write_first = end - self.ring <= max(self.n_global, start - self.pattern.reach + 1)
        if write_first:
            self._store(k, v)
            keys, values, kv_pos = self.k, self.v, self.pos  # (B, N_KV_HEADS, slots, D), (slots,)
        else:
            keys, values = torch.cat([self.k, k], dim=2), torch.cat([self.v, v], dim=2)  # (B, N_KV_HEADS, slots + T, D)
            kv_pos = torch.cat([self.pos, torch.arange(start, end, device=q.device)])  # (slots + T,)
        q_idx = torch.arange(start, end, device=q.device)[:, None]  # (T, 1)
        mask = self.pattern.mask_mod(None, None, q_idx, kv_pos[None, :]) & (kv_pos >= 0)  # (T, keys); empty slots out
        if softcap is None and alibi is None and sinks is None:
            y = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=scale,
                                               enable_gqa=q.size(1) != k.size(1))
        else:
            y = score_mod_attention(q, keys, values, mask, q_pos=q_idx[:, 0], k_pos=kv_pos, scale=scale,
                                    softcap=softcap, alibi=alibi, sinks=sinks)
        if not write_first:
            self._store(k, v)
        return y  # (B, N_HEADS, T, D)

    def extend(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Store this step's k, v (B, heads, T, ·), positions `length` onwards, and return what a query of this step
        may see: the slots before the write and the new positions, (B, heads, slots + T, ·) each, with the (T,
        slots + T) mask of which each query sees (the pattern's predicate; empty slots never) and each key's
        position (slots + T,) (-1: empty)."""
        start, end = self.length, self.length + k.size(2)
        if end > self.max_len:
            raise ValueError(f"KV cache full: {end} positions, made for {self.max_len}")
        keys, values = torch.cat([self.k, k], dim=2), torch.cat([self.v, v], dim=2)
        kv_pos = torch.cat([self.pos, torch.arange(start, end, device=k.device)])  # (slots + T,)
        q_idx = torch.arange(start, end, device=k.device)[:, None]  # (T, 1)
        visible = self.pattern.mask_mod(None, None, q_idx, kv_pos[None, :]) & (kv_pos >= 0)  # (T, slots + T)
        self._store(k, v)
        return keys, values, visible, kv_pos

    def truncate(self, length: int) -> None:
        """Forget the positions from `length` on (speculative decoding drops rejected drafts). The ring must still hold
        what a query at `length` sees: a cache made with `rollback` r can go back r positions after any step."""
        if length >= self.length:
            return
        needed = max(self.n_global, length - self.pattern.reach + 1)  # the oldest position a query at `length` sees
        if needed < length and self.oldest > needed:
            raise ValueError(f"cannot roll back to position {length}: the ring already dropped positions before "
                             f"{self.oldest} (make the cache with a larger rollback)")
        self.pos.masked_fill_(self.pos >= length, -1)
        self.length = length

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes


class RollingLatentCache(RollingKVCache):
    """A multi-head latent attention layer's cache under a sparse pattern: the normalised latents (B, S, latent) and
    rope keys (B, 1, S, rope) of the positions the pattern can still show a later query (RollingKVCache's slots)."""

    def __init__(self, pattern: SparsePattern, batch_size: int, max_len: int, latent_dim: int, rope_dim: int,
                 rollback: int = 0, device=None, dtype=None) -> None:
        super().__init__(pattern, batch_size, 1, max_len, latent_dim, rollback, device, dtype, v_dim=rope_dim)

    def extend(self, latent: torch.Tensor, k_pe: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """This step's latents (B, T, latent) and rope keys (B, 1, T, rope) → the visible ones', (B, S, latent) and
        (B, 1, S, rope), the (T, S) mask and the keys' positions (see RollingKVCache.extend)."""
        latents, k_pes, visible, kv_pos = super().extend(latent[:, None], k_pe)
        return latents[:, 0], k_pes, visible, kv_pos


_TILE_BIASES: dict = {}  # (pattern, T, chunk, query heads per K/V head, dtype, device) → each chunk's additive mask
_TILE_BYTES = [0]  # what _TILE_BIASES holds, in bytes (at most 256 MiB, or one entry)
_BLOCK_MASKS: dict = {}  # (pattern, T, device) → FlexAttention BlockMask
_FLEX: dict = {}  # "compiled": flex_attention through torch.compile, made on first use

try:
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
except ImportError:  # a torch without FlexAttention: the blockwise path serves every device
    create_block_mask = flex_attention = None


def chunk_keys(pattern: SparsePattern, T: int, start: int, rows: int) -> tuple[int, int]:
    """The band of keys the chunk of queries `start .. start + rows - 1` gathers, as (first, end): the positions
    from `lookback` before its first query to its last, after the `min(n_global, T)` globals (gathered apart); empty
    for a chunk that lies within the globals."""
    end = start + rows
    return min(max(start - pattern.lookback, min(pattern.n_global, T)), end), end


def tile_biases(pattern: SparsePattern, T: int, chunk: int, groups: int, dtype: torch.dtype,
                device: torch.device) -> list:
    """What each chunk's tile adds to its scores: 0 where the query sees the gathered key, the dtype's lowest value
    where not; (groups·rows, globals + band) per chunk, rows repeated for the `groups` query heads that share a K/V
    head. Built once per (pattern, T, chunk, groups) and cached: a pattern that repeats along the sequence (every one
    here) makes the inner chunks' tiles equal, and they share one tensor. The floor is finite, not -inf: a query that
    saw nothing would get a uniform row instead of NaN (none of the patterns here has one); a query that sees
    something gets exactly 0 weight on what it does not see."""
    key = (pattern, T, chunk, groups, dtype, str(device))
    if key in _TILE_BIASES:
        return _TILE_BIASES[key]
    P, biases, last = min(pattern.n_global, T), [], None
    for start in range(0, T, chunk):
        rows = min(chunk, T - start)
        first, end = chunk_keys(pattern, T, start, rows)
        q_idx = torch.arange(start, start + rows, device=device)[:, None]  # (rows, 1)
        kv_idx = torch.cat([torch.arange(P, device=device), torch.arange(first, end, device=device)])[None, :]
        visible = pattern.mask_mod(None, None, q_idx, kv_idx)  # (rows, globals + band)
        bias = torch.zeros(visible.shape, dtype=dtype, device=device).masked_fill_(~visible, torch.finfo(dtype).min)
        if last is not None and last.shape[0] == groups * rows and torch.equal(last[:rows], bias):
            biases.append(last)  # the same tile as the chunk before: one tensor for all of them
            continue
        last = bias.repeat(groups, 1) if groups > 1 else bias  # (groups·rows, globals + band)
        biases.append(last)
    size = sum(t.numel() * t.element_size() for t in {id(t): t for t in biases}.values())
    if len(_TILE_BIASES) >= 64 or _TILE_BYTES[0] + size > 256 * 2**20:  # many lengths (e.g. prefills while
        _TILE_BIASES.clear()                                             # generating): keep the cache bounded
        _TILE_BYTES[0] = 0
    _TILE_BIASES[key] = biases
    _TILE_BYTES[0] += size
    return biases


class BlockwiseAttention(torch.autograd.Function):
    """Attention over only the keys each chunk of queries can see, with a backward that recomputes each tile's
    probabilities (FlashAttention's recipe): forward keeps q, k, v and the output, never a tile.

    Queries are cut into chunks of `pattern.chunk` positions; each chunk takes its keys (the band from `lookback`
    before its first query to its last one: a view of K and V, copied only to put the globals in front of it) and
    computes one (queries × keys) tile: time O(T·(n_global + chunk + lookback)), memory O(T) beyond the tile in
    flight (with attention dropout, plus its keep-masks: one bool per tile entry). A row's keys all sit in one tile, so its softmax is the usual max-subtracted one, exact and stable, and
    is recomputed exactly in backward. The G query heads that share a K/V head form one tile: K and V are never
    repeated. A loop over chunks (its trip count is T's, not the data's): each tile stays in cache while the matmuls,
    softmax and gradient products use it, where whole-sequence batched tiles would go through memory at every step."""

    @staticmethod
    @torch.amp.custom_fwd(device_type="cuda")  # backward then runs under the autocast state forward ran under
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pattern: SparsePattern,
                dropout_p: float, scale: float | None = None, softcap: float | None = None,
                alibi: torch.Tensor | None = None, sinks: torch.Tensor | None = None) -> torch.Tensor:
        B, H, T, D = q.shape
        kv_heads, Dv = k.size(1), v.size(-1)  # Dv: the values' width (multi-head latent attention's may differ)
        G, C, P = H // kv_heads, pattern.chunk, min(pattern.n_global, T)
        scale = D**-0.5 if scale is None else scale
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        keys, values = k.view(B * kv_heads, T, D), v.view(B * kv_heads, T, Dv)  # one matrix per K/V head
        # (B, N_HEADS, T, D) laid out as (B, T, N_HEADS, D): the caller's transpose back to (B, T, N_HEADS·D) for the
        # output projection is then a view, and the one tensor the projection and this backward both keep.
        y = q.new_empty(B, T, H, Dv).transpose(1, 2)
        biases = tile_biases(pattern, T, C, G, q.dtype, q.device)
        masks = []
        for i, start in enumerate(range(0, T, C)):
            rows = min(C, T - start)
            first, end = chunk_keys(pattern, T, start, rows)
            q_tile = q[:, :, start:start + rows].reshape(B * kv_heads, G * rows, D)  # (B·N_KV_HEADS, G·rows, D)
            k_tile, v_tile = keys[:, first:end], values[:, first:end]  # (B·N_KV_HEADS, band, D)
            if P:
                k_tile = torch.cat([keys[:, :P], k_tile], dim=1)  # (B·N_KV_HEADS, globals + band, D)
                v_tile = torch.cat([values[:, :P], v_tile], dim=1)
            probs = _tile_probs(q_tile, k_tile, biases[i], scale, softcap, alibi, pattern, T, start, rows, sinks)[0]
            if dropout_p > 0.0:
                keep = torch.empty_like(probs, dtype=torch.bool).bernoulli_(1.0 - dropout_p)
                probs = probs.mul_(keep).div_(1.0 - dropout_p)
                masks.append(keep)
            out = torch.bmm(probs, v_tile)  # (B·N_KV_HEADS, G·rows, Dv)
            y[:, :, start:start + rows] = out.view(B, H, rows, Dv)
        ctx.pattern, ctx.dropout_p, ctx.scale, ctx.softcap = pattern, dropout_p, scale, softcap
        ctx.save_for_backward(q, k, v, y, alibi, sinks, *masks)
        return y  # (B, N_HEADS, T, D)

    @staticmethod
    @torch.amp.custom_bwd(device_type="cuda")
    def backward(ctx, dy: torch.Tensor):
        q, k, v, y, alibi, sinks, *masks = ctx.saved_tensors
        pattern, dropout_p, scale, softcap = ctx.pattern, ctx.dropout_p, ctx.scale, ctx.softcap
        B, H, T, D = q.shape
        kv_heads, Dv = k.size(1), v.size(-1)
        G, C, P = H // kv_heads, pattern.chunk, min(pattern.n_global, T)
        keys, values = k.view(B * kv_heads, T, D), v.view(B * kv_heads, T, Dv)
        # dscores = probs ∘ (dprobs − Σ_keys probs ∘ dprobs); that row sum is Σ_D dy ∘ y (dropout included)
        delta = (dy * y).sum(dim=-1, keepdim=True)  # (B, N_HEADS, T, 1)
        dq = torch.empty_like(q)
        # every chunk adds into the globals' dK and dV: accumulate bf16/fp16 in fp32 (cast back on return)
        acc = torch.float32 if k.dtype in (torch.float16, torch.bfloat16) else k.dtype
        dk, dv = torch.zeros_like(k, dtype=acc), torch.zeros_like(v, dtype=acc)
        dkeys, dvalues = dk.view(B * kv_heads, T, D), dv.view(B * kv_heads, T, Dv)
        biases = tile_biases(pattern, T, C, G, q.dtype, q.device)
        # a sink's gradient: −p_sink · Σ_D dy ∘ y over its head's queries (its column has no value)
        dsinks = None if sinks is None else torch.zeros(B, kv_heads, G, dtype=acc, device=q.device)
        for i, start in enumerate(range(0, T, C)):
            rows = min(C, T - start)
            first, end = chunk_keys(pattern, T, start, rows)
            q_tile = q[:, :, start:start + rows].reshape(B * kv_heads, G * rows, D)
            dy_tile = dy[:, :, start:start + rows].reshape(B * kv_heads, G * rows, Dv)
            delta_tile = delta[:, :, start:start + rows].reshape(B * kv_heads, G * rows, 1)
            k_tile, v_tile = keys[:, first:end], values[:, first:end]
            if P:
                k_tile = torch.cat([keys[:, :P], k_tile], dim=1)
                v_tile = torch.cat([values[:, :P], v_tile], dim=1)
            probs, slope = _tile_probs(q_tile, k_tile, biases[i], scale, softcap, alibi, pattern, T, start, rows, sinks)
            if dsinks is not None:
                p_sink = 1.0 - probs.to(acc).sum(dim=-1)  # (B·N_KV_HEADS, G·rows)
                dsinks -= (p_sink * delta_tile[..., 0].to(acc)).view(B, kv_heads, G, rows).sum(dim=-1)
            dprobs = torch.bmm(dy_tile, v_tile.transpose(1, 2))  # (B·N_KV_HEADS, G·rows, keys)
            if dropout_p > 0.0:
                keep = masks[i]
                dprobs = dprobs.mul_(keep).div_(1.0 - dropout_p)
                dv_tile = torch.bmm((probs * keep).div_(1.0 - dropout_p).transpose(1, 2), dy_tile)
            else:
                dv_tile = torch.bmm(probs.transpose(1, 2), dy_tile)  # (B·N_KV_HEADS, keys, D)
            dscores = dprobs.sub_(delta_tile).mul_(probs)  # (B·N_KV_HEADS, G·rows, keys)
            if slope is not None:  # through the cap: d(cap · tanh(s / cap))/ds = 1 − tanh²(s / cap)
                dscores = dscores.mul_(slope)
            dq[:, :, start:start + rows] = torch.bmm(dscores, k_tile).view(B, H, rows, D)
            dk_tile = torch.bmm(dscores.transpose(1, 2), q_tile)  # (B·N_KV_HEADS, keys, D)
            dkeys[:, first:end].add_(dk_tile[:, P:], alpha=scale)
            dvalues[:, first:end].add_(dv_tile[:, P:])
            if P:
                dkeys[:, :P].add_(dk_tile[:, :P], alpha=scale)
                dvalues[:, :P].add_(dv_tile[:, :P])
        dsinks = None if dsinks is None else dsinks.sum(dim=0).view(-1).to(sinks.dtype)
        return dq.mul_(scale), dk.to(k.dtype), dv.to(v.dtype), None, None, None, None, None, dsinks


def _tile_softmax(scores: torch.Tensor, sinks: torch.Tensor | None, rows: int) -> torch.Tensor:
    """A tile's softmax (B·N_KV_HEADS, G·rows, keys), each row's head's sink logit in its denominator when given."""
    if sinks is None:
        return scores.softmax(dim=-1)
    kv_heads, G = sinks.numel() * rows // scores.size(1), scores.size(1) // rows
    per_row = sinks.view(kv_heads, G, 1).expand(kv_heads, G, rows).reshape(kv_heads, G * rows)  # each row's sink
    return sink_softmax(scores.view(-1, kv_heads, *scores.shape[1:]), per_row).view(scores.shape)


def _tile_probs(q_tile: torch.Tensor, k_tile: torch.Tensor, bias: torch.Tensor, scale: float, softcap: float | None,
                alibi: torch.Tensor | None, pattern: SparsePattern, T: int, start: int, rows: int,
                sinks: torch.Tensor | None = None):
    """One tile's probabilities (B·N_KV_HEADS, G·rows, keys), and, under a cap, the cap's slope at each score
    (1 − tanh², for backward; else None). Without a cap or ALiBi, one fused baddbmm as before; with `sinks`, each
    head's sink logit joins its rows' denominators."""
    if softcap is None and alibi is None:
        return _tile_softmax(torch.baddbmm(bias, q_tile, k_tile.transpose(1, 2), alpha=scale), sinks, rows), None
    scores = torch.bmm(q_tile, k_tile.transpose(1, 2)).mul_(scale)  # (B·N_KV_HEADS, G·rows, keys)
    slope = None
    if softcap is not None:
        tanh = torch.tanh(scores / softcap)
        scores, slope = tanh * softcap, 1.0 - tanh * tanh
    scores = scores + bias
    if alibi is not None:
        first, end = chunk_keys(pattern, T, start, rows)
        k_pos = torch.cat([torch.arange(min(pattern.n_global, T), device=q_tile.device),
                           torch.arange(first, end, device=q_tile.device)])
        q_pos = torch.arange(start, start + rows, device=q_tile.device)
        H = alibi.numel()
        tile = alibi_bias(alibi, q_pos, k_pos).to(scores.dtype)  # (N_HEADS, rows, keys)
        kv_heads = H * rows // q_tile.size(1)
        scores = (scores.view(-1, kv_heads, *scores.shape[1:]) + tile.reshape(kv_heads, -1, tile.size(-1))
                  ).view(scores.shape)
    return _tile_softmax(scores, sinks, rows), slope


# A compiled graph calls it eagerly (a graph break): compiled, its chunk loop would be unrolled, compile time growing
# with T (a 2-block mistral-like-tiny at T = 1024: 136 s to compile, 48 ms a step; with the break 12 s and 33 ms).
@torch.compiler.disable
def blockwise_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pattern: SparsePattern,
                        dropout_p: float = 0.0, scale: float | None = None, softcap: float | None = None,
                        alibi: torch.Tensor | None = None, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """q (B, N_HEADS, T, D), k and v (B, N_KV_HEADS, T, D) → (B, N_HEADS, T, D) over only the keys each chunk of
    queries can see, in plain PyTorch on any device (see BlockwiseAttention); scale, softcap, alibi and sinks as in
    archspec.runtime.scores."""
    return BlockwiseAttention.apply(q, k, v, pattern, dropout_p, scale, softcap, alibi, sinks)


def flex_block_mask(pattern: SparsePattern, T: int, device: torch.device):
    """FlexAttention's block mask for `pattern` at length T: built once per (pattern, T, device), then reused by every
    layer and step (inside a compiled graph too: the graph reads the cached mask)."""
    mask = _BLOCK_MASKS.get((pattern, T, str(device)))
    return mask if mask is not None else _build_block_mask(pattern, T, device)


@torch.compiler.disable  # built eagerly, once: never re-derived inside a compiled graph on every call
def _build_block_mask(pattern: SparsePattern, T: int, device: torch.device):
    if len(_BLOCK_MASKS) >= 64:  # many lengths (e.g. while generating): keep the cache bounded
        _BLOCK_MASKS.clear()
    mask = _BLOCK_MASKS[(pattern, T, str(device))] = create_block_mask(pattern.mask_mod, None, None, T, T, device=device)
    return mask


def flex_attention_fn():
    """FlexAttention as the current context needs it: inside a compiled graph the enclosing graph compiles it; outside
    one it goes through its own torch.compile (eager FlexAttention materialises the T×T scores)."""
    if torch.compiler.is_compiling():
        return flex_attention
    if "compiled" not in _FLEX:
        _FLEX["compiled"] = torch.compile(flex_attention, dynamic=False)
    return _FLEX["compiled"]



_SCORE_MODS: dict = {}  # (softcap, slopes' values, device) → score_mod: one function object per setting (see below)


def flex_score_mod(softcap: float | None, alibi: torch.Tensor | None):
    """FlexAttention's `score_mod` for a cap and ALiBi slopes (None when neither: no score_mod at all). FlexAttention
    has applied the scale already; then, as everywhere (archspec.runtime.scores), the cap and the bias.

    Outside a compiled graph the compiled flex_attention guards on the score_mod object, so each setting keeps one
    (a new closure per call would recompile every call, then fall back to eager); inside one the graph traces it."""
    if softcap is None and alibi is None:
        return None
    if torch.compiler.is_compiling():
        return _make_score_mod(softcap, alibi)
    key = (softcap, None if alibi is None else (tuple(alibi.tolist()), str(alibi.device)))
    if key not in _SCORE_MODS:
        if len(_SCORE_MODS) >= 64:
            _SCORE_MODS.clear()
        _SCORE_MODS[key] = _make_score_mod(softcap, alibi)
    return _SCORE_MODS[key]


def _make_score_mod(softcap: float | None, alibi: torch.Tensor | None):

    def score_mod(score, b, h, q_idx, kv_idx):
        if softcap is not None:
            score = torch.tanh(score / softcap) * softcap
        if alibi is not None:
            score = score + alibi[h] * (kv_idx - q_idx)
        return score

    return score_mod


def flex_sparse_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pattern: SparsePattern, *,
                          scale: float | None = None, softcap: float | None = None, alibi: torch.Tensor | None = None,
                          sinks: torch.Tensor | None = None, attention=None) -> torch.Tensor:
    """FlexAttention's path of sparse_attention (`attention`: the flex_attention to call; default the compiled one).
    Sinks: FlexAttention's softmax has no extra column, so its log-sum-exp is asked for and the output rescaled,
    y · Σ exp(s) / (Σ exp(s) + exp(sink)) = y · sigmoid(lse − sink): the same function, differentiable in the sink."""
    attention = attention or flex_attention_fn()
    mask = flex_block_mask(pattern, q.size(2), q.device)
    kwargs = dict(score_mod=flex_score_mod(softcap, alibi), block_mask=mask, scale=scale,
                  enable_gqa=k.size(1) != q.size(1))
    if sinks is None:
        return attention(q, k, v, **kwargs)  # (B, N_HEADS, T, D)
    y, lse = attention(q, k, v, return_lse=True, **kwargs)  # lse (B, N_HEADS, T), natural log
    keep = torch.sigmoid(lse.float() - sinks.float()[None, :, None])  # (B, N_HEADS, T): 1 − p_sink
    return (y * keep[..., None].to(y.dtype)).to(q.dtype)


def sparse_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pattern: SparsePattern,
                     dropout_p: float = 0.0, *, scale: float | None = None, softcap: float | None = None,
                     alibi: torch.Tensor | None = None, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """q (B, N_HEADS, T, D), k and v (B, N_KV_HEADS, T, D) → (B, N_HEADS, T, D), attending where `pattern` allows;
    `scale` (default 1/sqrt(D)), `softcap`, `alibi` (N_HEADS slopes) and `sinks` (N_HEADS logits) change the
    scores as archspec.runtime.scores says, on every path.

    On CUDA: FlexAttention, whose kernels skip the blocks the block mask rules out (forward and backward). Elsewhere,
    and with attention dropout (FlexAttention has none): the blockwise path, which trains on any device
    (FlexAttention has no backward on CPU)."""
    if logit_observers:
        positions = torch.arange(q.size(2), device=q.device)
        visible = pattern.mask_mod(None, None, positions[:, None], positions[None, :])  # (T, T), True: attend
        for observe in logit_observers:
            observe(q, k, visible, scale)
    if q.is_cuda and dropout_p == 0.0 and flex_attention is not None:
        return flex_sparse_attention(q, k, v, pattern, scale=scale, softcap=softcap, alibi=alibi,
                                     sinks=sinks)  # (B, N_HEADS, T, D)
    return blockwise_attention(q, k, v, pattern, dropout_p, scale, softcap, alibi, sinks)
