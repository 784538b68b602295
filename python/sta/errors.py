"""Exceptions of the sta package: one class per status group of sta.h.

str(e) is sta_last_error()'s text, word for word (STA.md section 9's
messages arrive verbatim); e.status is the numeric code, e.status_name its
constant name ("STA_ERR_SEQ_LEN"), e.group its hundreds group.  Each class
also derives from the builtin exception a Python caller would expect, so
``except ValueError`` catches bad arguments.
"""

__all__ = ["Error", "ArgumentError", "StateError", "UnsupportedError",
           "OutOfMemoryError", "DeviceError", "EnvError", "LibraryNotFound",
           "error_class"]


class Error(Exception):
    """Base of every error sta raises."""

    def __init__(self, message, status=0, status_name="STA_OK"):
        super().__init__(message)
        self.message = message
        self.status = int(status)
        self.status_name = status_name
        self.group = (self.status // 100) * 100
        if hasattr(self, "add_note") and status:  # Python >= 3.11: shown in tracebacks
            self.add_note("sta status: %s (%d)" % (status_name, self.status))

    def __reduce__(self):
        return (type(self), (self.message, self.status, self.status_name))


class ArgumentError(Error, ValueError):
    """1xx: a bad argument (shape, dtype, window, missing strategy key)."""


class StateError(Error, RuntimeError):
    """2xx: the runtime state does not allow the call (contexts, strategy)."""


class UnsupportedError(Error, RuntimeError):
    """3xx: a valid request the runtime cannot serve (backend, seq_len)."""


class OutOfMemoryError(Error, MemoryError):
    """4xx: out of host or device memory."""


class DeviceError(Error, RuntimeError):
    """5xx: the device (driver, runtime, kernel launch) failed."""


class EnvError(Error, OSError):
    """6xx: files and the environment (open, read, format, config)."""


class LibraryNotFound(Error, ImportError):
    """libsta.so could not be found or loaded; the message lists where."""


_GROUPS = {100: ArgumentError, 200: StateError, 300: UnsupportedError,
           400: OutOfMemoryError, 500: DeviceError, 600: EnvError}


def error_class(status):
    """The exception class of a status code (Error when the group is unknown)."""
    return _GROUPS.get((int(status) // 100) * 100, Error)
