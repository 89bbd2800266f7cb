"""Code that runs on the job's hosts rather than in the launcher: the ssh watchdog and its
process scan (shipped to each host as source), the engines' rank shim, the Slurm batch driver
and the scheduler rendezvous. Standard library only (a test checks it): a host needs Python 3
and nothing else.
"""
