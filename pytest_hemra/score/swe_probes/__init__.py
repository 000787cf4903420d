"""What HEMRA copies into a SWE sandbox to read the hidden tests' results from a file: a pytest
plugin and a unittest runner, each writing one line a test (outcome, file, id) to the path in
`HEMRA_SWE_REPORT`. They run under the task image's Python, so they import only `os` and `sys`
(already loaded when the interpreter starts, so a module the agent put in /app cannot stand in
for them) and the test framework."""
