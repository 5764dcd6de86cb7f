"""Launchers: where a sweep's (or a train command's) runs are trained — this process (`local`), SLURM through submitit
(`slurm`, and `slurm-local` to rehearse it here), or Ray (`ray`). See archspec.launch.base for the contract."""
