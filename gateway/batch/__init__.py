"""Batch jobs (OpenAI's Batch API): files in, a job's lines admitted in the batch lane, results out
in input order, run by whichever gateway holds the job's lease (`docs/batch.md`).

`door.py` (the door: files and jobs), `jobs.py` (JobStore: the jobs in Redis),
`input.py` (a line checked), `runner.py` (the jobs' states and windows),
`lease.py` (the lease, through which a runner writes the job's record), `lines.py`
(one line through admission, with retries), `writer.py` (results in input order, fsynced),
`output.py` (a result line rendered), `sweep.py` (files whose records expired, removed).
"""
