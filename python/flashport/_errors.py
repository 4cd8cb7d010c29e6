"""flashport.Error: every failure of the library, with its status."""
from . import _C

_STATUS_NAMES = _C.status_names()
_STATUS_CODES = {name: code for code, name in enumerate(_STATUS_NAMES)}


class Error(Exception):
    """A call flashport refused or failed.

    status: the library's status code (``flashport_status``); status_name: its name, e.g.
    ``"FLASHPORT_ERR_HEAD_RATIO"``; message: what was wrong (``flashport_last_error``).
    """

    def __init__(self, status, status_name, message):
        super().__init__(status, status_name, message)
        self.status = status
        self.status_name = status_name
        self.message = message

    def __str__(self):
        return f"{self.status_name}: {self.message}"


def status_code(name):
    return _STATUS_CODES[name]


def error(name, message):
    """The Error of status `name` (for what the Python layer itself refuses)."""
    return Error(_STATUS_CODES[name], name, message)


_C._set_error_type(Error)
