"""Sweeps that survive: resume, interrupted jobs, and one speed measurement at a time per machine.

- `job` (job.py): everything around one job: signals raise, `resume` may skip it, the speed lock.
- `resume` (resume.py): a job whose identical config already FINISHED, measured by the same code, is
  skipped (`resume_ignore_code=true`: by any code); RUNNING runs of killed processes are marked FAILED first.
- `signals` (signals.py): SIGTERM, SIGHUP and SIGINT end the run FAILED with what it measured; a job in a
  sweep's worker process (joblib's) dies with the sweep's driver, one killed by SIGKILL included.
- `destinations` (destinations.py): Hydra's output folder and the tracker's store are checked before
  anything runs; a refused run leaves no empty output folder behind; each run claims its own folder.
- `lock` (lock.py): the machine's speed lock, one timing at a time (`exclusive: true`).
- `callback` (callback.py): one MLflow parent run per sweep (`SweepCallback`).

Imports go one way: this package uses specresearch.tracking and specresearch.records, never the reverse.
"""

from specresearch.stores import pid_alive
from specresearch.sweeps.callback import SweepCallback, forward_env_to_ray, is_ray
from specresearch.sweeps.destinations import check_destinations, claim_folder, discard_refused_run
from specresearch.sweeps.job import job, objective_value
from specresearch.sweeps.lock import lock_path, speed_lock
from specresearch.sweeps.outcomes import JobFailed, JobSkipped, job_outcome
from specresearch.sweeps.resume import finished_run, ignore_code, resume_on, stop_local_jobs
from specresearch.sweeps.signals import Interrupted, exit_on_signals, restore_signals

__all__ = [
    "Interrupted", "JobFailed", "JobSkipped", "SweepCallback", "check_destinations", "claim_folder", "discard_refused_run",
    "exit_on_signals", "finished_run", "forward_env_to_ray", "ignore_code", "is_ray", "job", "job_outcome", "lock_path",
    "objective_value", "pid_alive", "restore_signals", "resume_on", "speed_lock", "stop_local_jobs",
]
