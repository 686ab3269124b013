"""Batch screening: many operators, isolated, across devices, with timeouts, retries and resume.

Each operator is one `python -m harness record|replay` subprocess in its own process group, so
its per-op dir is exactly a single run's (replayable alone later). Operators are sharded over
devices by a stable hash (a resumed batch lands each op on the same device) and run serially
within a device. `ops_status.csv` is rewritten atomically after every op, and a per-op
completion marker makes `--resume` skip ops that already PASSed or SKIPped, or that triage found
failing or timing out upstream too. This package is the scheduler: the batch dir's files are
harness.core.batchdir's, and which ops run is harness.providers.selection's.
A batch holds its dir's owner lock while it runs and stores its selection and options in
batch.json; `--resume` refuses a dir whose owner still runs, stops what a dead owner left
running (before it uses that device), and reuses what the command line does not give again.

options: what a batch runs its ops with; facts: what an attempt left to read; resume: what batch.json
stores for a resume and how it is read back; executor: each attempt's process and the device threads
(the local executor); job: an op's attempts, retries and triage (Batch); session: `python -m harness
batch`. Their public names are re-exported here, for `from harness.sessions import batch`.
"""

from harness.sessions.batch.executor import KILL_GRACE_S, LocalExecutor, NotStarted, shard, stop_leftovers
from harness.sessions.batch.job import MAX_RETRIES, Batch
from harness.sessions.batch.options import Options
from harness.sessions.batch.session import run_from_args

__all__ = ["KILL_GRACE_S", "MAX_RETRIES", "Batch", "LocalExecutor", "NotStarted", "Options", "run_from_args", "shard",
           "stop_leftovers"]
