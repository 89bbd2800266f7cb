"""Code that runs on the job's hosts rather than in the launcher: the ssh watchdog with what it
imports (its processes' output and ends, the process scan, the host's figures, the interface
lookup; shipped to each host as source), the engines' rank shim and its task table, the Slurm
batch driver and the scheduler rendezvous. Standard library only, and ``dmlc_env`` (itself
standard library only; a test checks both): a host needs Python 3 and nothing else.
"""
