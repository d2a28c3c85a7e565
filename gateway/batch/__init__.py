"""Batch jobs (OpenAI's Batch API): files in, a job's lines admitted in the batch lane, results out
in input order, run by whichever gateway holds the job's lease (`docs/batch.md`).

`batch_http.py` (the door: files and jobs), `batch_jobs.py` (JobStore: the jobs in Redis),
`batch_input.py` (a line checked), `batch_runner.py` (the jobs' states and windows),
`batch_lease.py` (the lease, through which a runner writes the job's record), `batch_lines.py`
(one line through admission, with retries), `batch_writer.py` (results in input order, fsynced),
`batch_output.py` (a result line rendered), `batch_sweep.py` (files whose records expired, removed).
"""
