"""Packaging beyond pyproject.toml: the package list and its data.

The alembic templates are in ``sqla_queue/alembic_templates/``. Each
template folder (``generic``, ``multidb``) holds an ``env.py`` and no
``__init__.py``, so ``find_packages`` skips it while setuptools takes it for
a package anyway: it is listed here as one, with its README and .mako files
as its data (left out, setuptools warns for each file that it is absent
from ``packages``, and will stop shipping it).

``package_dir={"": "."}`` says, what is true, that every package sits under
the project root: setuptools then makes an editable install (``pip install
-e .``, ``make quickstart``) a ``.pth`` file, and prints none of its
ten-line notice about a meta path finder. Everything else is in
pyproject.toml.
"""

from pathlib import Path

from setuptools import find_packages, setup

TEMPLATES = Path(__file__).parent / "sqla_queue" / "alembic_templates"
template_packages = [
    f"sqla_queue.alembic_templates.{folder.name}"
    for folder in sorted(TEMPLATES.iterdir())
    if folder.is_dir() and folder.joinpath("env.py").is_file()
]

setup(
    packages=[*find_packages(include=["sqla_queue", "sqla_queue.*"]), *template_packages],
    package_dir={"": "."},
    package_data={
        "sqla_queue": ["py.typed", "spark/log4j2.properties"],
        **{package: ["README", "*.mako"] for package in template_packages},
    },
)
