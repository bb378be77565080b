<%!
import re

%>"""${message}

Revision ID: ${up_revision}
Revises: ${down_revision | comma,n}
Create Date: ${create_date}

"""
from typing import Sequence, Union

from alembic import op
import sqlalchemy as sa
import sqla_queue.alembic  # noqa: F401 (registers the op.*_queue_* operations)
import sqla_queue.common.types  # noqa: F401 (the queue columns' types)
<%
    # the renderers add the lines above to imports as well: written once
    extra = [line for line in (imports or "").splitlines() if not line.startswith(("import sqla_queue.alembic", "import sqla_queue.common.types"))]
%>
${"\n".join(extra)}

# revision identifiers, used by Alembic.
revision: str = ${repr(up_revision)}
down_revision: Union[str, Sequence[str], None] = ${repr(down_revision)}
branch_labels: Union[str, Sequence[str], None] = ${repr(branch_labels)}
depends_on: Union[str, Sequence[str], None] = ${repr(depends_on)}


def upgrade(engine_name: str) -> None:
    """Upgrade schema."""
    globals()["upgrade_%s" % engine_name]()


def downgrade(engine_name: str) -> None:
    """Downgrade schema."""
    globals()["downgrade_%s" % engine_name]()

<%
    db_names = config.get_main_option("databases")
%>

## an "upgrade_<name>() / downgrade_<name>()" pair for each database in alembic.ini

% for db_name in re.split(r',\s*', db_names):

def upgrade_${db_name}() -> None:
    """Upgrade ${db_name} schema."""
    ${context.get("%s_upgrades" % db_name, "pass")}


def downgrade_${db_name}() -> None:
    """Downgrade ${db_name} schema."""
    ${context.get("%s_downgrades" % db_name, "pass")}

% endfor
