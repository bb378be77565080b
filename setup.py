"""Packaging beyond pyproject.toml: the top-level alembic_templates/ folder
is shipped inside the package, as sqla_queue.alembic_templates.

pyproject.toml cannot list packages found by ``find`` plus one mapped from
another folder; here ``find`` keeps picking up every sqla_queue subpackage
and the templates are added to it. Each template folder (``generic``,
``multidb``) holds an ``env.py``, so setuptools takes it for a package: it
is listed as one, with its README and .mako files as its data (left out,
setuptools warns for each that it is absent from ``packages``, and will stop
shipping it). Everything else is in pyproject.toml.
"""

from pathlib import Path

from setuptools import find_packages, setup

TEMPLATES = "sqla_queue.alembic_templates"
template_packages = [
    f"{TEMPLATES}.{folder.name}"
    for folder in sorted(Path(__file__).parent.joinpath("alembic_templates").iterdir())
    if folder.is_dir() and folder.joinpath("env.py").is_file()
]

setup(
    packages=[
        *find_packages(include=["sqla_queue", "sqla_queue.*"]),
        TEMPLATES,
        *template_packages,
    ],
    package_dir={TEMPLATES: "alembic_templates"},
    package_data={
        "sqla_queue": ["py.typed", "spark/log4j2.properties"],
        **{package: ["README", "*.mako"] for package in template_packages},
    },
)
