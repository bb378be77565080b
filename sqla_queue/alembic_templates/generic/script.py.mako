"""${message}

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


def upgrade() -> None:
    """Upgrade schema."""
    ${upgrades if upgrades else "pass"}


def downgrade() -> None:
    """Downgrade schema."""
    ${downgrades if downgrades else "pass"}
