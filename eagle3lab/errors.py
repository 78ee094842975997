"""One error type for bad input, so that users see one clear paragraph, not a traceback.

Raise `UserError` when the input (a path, a file line, a field, a mismatch between two
artifacts) is wrong and the message can say what was found, what was expected and how to
fix it. The CLI prints it and exits 1; notebooks show it as an exception. An exception of
any other type is a bug or an input no check anticipated: the CLI prints it as one line
and exits 2 (`eagle3lab --debug` adds the traceback).
"""


class UserError(Exception):
    """Bad input: the message names the file/line/field, what was expected, and the fix."""
