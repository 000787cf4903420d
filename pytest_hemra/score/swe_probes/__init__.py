"""What HEMRA copies into a SWE sandbox to run the hidden tests and read their results from a
file: a start for `python -m pytest` that takes pytest and all it imports from the installed
distributions before the working folder joins sys.path, a pytest plugin and a unittest runner,
each writing one line a test (outcome, file, id) to a report path HEMRA writes into its copy (never
in the environment). They run under the task image's Python and import only what is already
loaded when they start (`os`, `sys`) and the test framework, so a module the agent put in /app
cannot stand in for them."""
