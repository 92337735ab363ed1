"""Where jobs run, behind one interface (base.Backend): local processes or Volcano jobs.

api.backend() chooses one; the CLI only ever talks to that interface.

  base        the Backend protocol and what it returns (JobStatus, DryRun, Submitted)
  local       jobs as processes on this machine (a supervisor per run)
  kubernetes  jobs as Volcano Jobs (gang-scheduled pods)
"""
