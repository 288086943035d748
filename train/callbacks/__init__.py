"""A training run in sight: Composer callbacks for the validation loss, image previews and cost, and what reads
the run's own log files back (curves) and turns a measured throughput into a plan.

- ``validation``: the training objective on a held-out MDS split at fixed timesteps and fixed noise, raw and EMA;
- ``previews``: a prompts x seeds grid through ``models.generation`` every ``preview_interval``;
- ``cost``: wall time, GPU-hours and dollars to reach each checkpoint, and an ETA;
- ``memory``: what each rank holds, counted, beside what the memory plan said (``memory/rank{r}.json``);
- ``spec``: the model spec carried into every checkpoint (``ModelSpec``, whose class name the file format holds);
- ``curves``: Composer's FileLogger files -> one figure across phases and restarts (`dwb runs plot`);
- ``plan``: throughput -> GPUs, images/s, days, GPU-hours and cost for a schedule (`dwb plan`).
"""
from models.common import face

__getattr__, __all__ = face(__name__, {
    "cost": "RunCost",
    "curves": "laid_out plot_runs read_run",
    "memory": "MemoryReport held_tensors",
    "plan": "measured_from_run plan_rows schedule_samples table",
    "previews": "Previews",
    "spec": "ModelSpec",
    "validation": "BANDS ValidationLoss read_held_out validation_figures",
})
