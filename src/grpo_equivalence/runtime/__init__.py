"""What a job runs on and how it stays safe: GPU leases (gpus, leasefolder, quietlock), the job's arguments and its
tie to the workflow (jobs), memory probes (memory), the environment a run records (environment), the code hash
that reruns a job (codedeps) and the workflow's paths (paths). Imports nothing else of the package."""
