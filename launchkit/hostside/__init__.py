"""Code that runs on the job's hosts rather than in the launcher: the ssh watchdog with the process
scan and the interface lookup it imports (shipped to each host as source), the engines' rank
shim, the Slurm batch driver and the scheduler rendezvous. Standard library only (a test checks it): a host needs Python 3
and nothing else.
"""
