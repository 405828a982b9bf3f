"""What the running Hydra app chose, read here (the CLI layer) and handed to the job as a
:class:`varbench.harness.job.JobContext`: the job itself never reads Hydra's global state, so a
programmatic run (tests, scripts, a notebook) gets the same job without a Hydra app around it."""
from __future__ import annotations

from varbench.harness.job import JobContext


def hydra_context() -> JobContext | None:
    """The method preset chosen (``method=nova_fast``), the task overrides and the sweep's job number
    of the running Hydra app; None outside one (tests, scripts)."""
    try:
        from hydra.core.hydra_config import HydraConfig

        hc = HydraConfig.get()
    except Exception:  # noqa: BLE001 - outside a Hydra app (tests, scripts)
        return None
    choice = hc.runtime.choices.get("method")
    return JobContext(method_choice=str(choice) if choice else None, overrides=tuple(hc.overrides.task),
                      job_num=hydra_job_num())


def hydra_job_num() -> int | None:
    """Hydra's 0-based number of this job in a sweep (None outside a sweep or outside Hydra)."""
    try:
        from hydra.core.hydra_config import HydraConfig

        return HydraConfig.get().job.get("num")
    except Exception:  # noqa: BLE001 - outside a Hydra app
        return None
