"""Running a command: from ``/execute``'s fields to a bounded reply, leaving no process behind.

Modules:

  commands    ``/execute``'s request fields, and running a command to a spooled outcome
  output      the output spooled to unnamed files, and the JSON reply streamed in chunks
  supervisor  process groups, the child subreaper and the kill rounds
  stopping    stop signals, honoured only from outside the server's own process tree (the
              commands' tree, which the supervisor knows)
"""
