"""The second stage: what a wheel holds and asks for, read without running it.

`wheels` reads one wheel (tags, top-level names, METADATA's requirements, its ELF files and the
sources worth reading) into a `WheelInspection`, cached by sha256 and read in worker processes;
`elf` reads what an ELF file asks of the loader; `loads` and `programs` read the native
libraries and the programs Python code names at run time (`literals` is the one evaluator of
what an expression's literals make it, shared by both; `program_reader` follows a name through
the code, `program_names` says what a program's name may be). Pure: it reads the files
it is given and imports no module that reaches a process, an engine or a network. May import
the cache and the errors; never a later stage (tests/test_layout.py).
"""
