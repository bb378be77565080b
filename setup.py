"""Packaging beyond pyproject.toml: the top-level alembic_templates/ folder
is shipped inside the package, as sqla_queue.alembic_templates.

pyproject.toml cannot list packages found by ``find`` plus one mapped from
another folder; here ``find`` keeps picking up every sqla_queue subpackage
and the templates are added to it. Everything else is in pyproject.toml.
"""

from setuptools import find_packages, setup

setup(
    packages=[
        *find_packages(include=["sqla_queue", "sqla_queue.*"]),
        "sqla_queue.alembic_templates",
    ],
    package_dir={"sqla_queue.alembic_templates": "alembic_templates"},
    package_data={
        "sqla_queue": ["py.typed", "spark/log4j2.properties"],
        "sqla_queue.alembic_templates": ["*/README", "*/*.mako", "*/*.py"],
    },
)
