"""Pipeline stages by cost: `plan_stages`, `StagePlan`, `layer_costs` live in archspec.stages, below the memory plan
(archspec.memory), which reads them too; named here for the pipeline (archspec.train.pipeline)."""

from archspec.stages import StagePlan, layer_costs, plan_stages

__all__ = ["StagePlan", "layer_costs", "plan_stages"]
