"""Where jobs run, behind one interface (base.Backend): local processes or Volcano jobs.

api.backend() chooses one; the CLI only ever talks to that interface.
"""
