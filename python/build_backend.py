"""PEP 517 build backend: setuptools, found even inside pip's isolated build
environment (offline), where only the interpreter's own site-packages hold it
(Debian's python3-setuptools and python3-wheel, which python3-pip depends
on, in /usr/lib/python3/dist-packages).  It asks for no build requirements,
so pip downloads nothing."""
import os
import sys


def _system_site():
    import sysconfig
    for d in (sysconfig.get_paths(vars={"base": sys.base_prefix,
                                        "platbase": sys.base_prefix})["purelib"],
              os.path.join(sys.base_prefix, "lib", "python3", "dist-packages"),
              "/usr/lib/python3/dist-packages"):
        if os.path.isdir(os.path.join(d, "setuptools")) and d not in sys.path:
            sys.path.append(d)
            return


try:
    import setuptools  # noqa: F401
    import wheel  # noqa: F401
except ImportError:
    _system_site()

from setuptools import build_meta as _meta  # noqa: E402
from setuptools.build_meta import *  # noqa: F401,F403,E402


def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def get_requires_for_build_editable(config_settings=None):
    return []


prepare_metadata_for_build_wheel = _meta.prepare_metadata_for_build_wheel
build_wheel = _meta.build_wheel
build_sdist = _meta.build_sdist
