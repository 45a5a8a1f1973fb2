"""ORM models, one module per domain; importing this package registers every table on ``Base.metadata``."""

from core.models.artifacts import Artifact
from core.models.cluster import GPU, Deployment, Host, SchedulerLease
from core.models.datasets import Dataset
from core.models.forecasts import Forecast
from core.models.jobs import (
    Attempt,
    Checkpoint,
    CheckpointExport,
    Event,
    Job,
    JobDependency,
    JobMetric,
    Sweep,
    Usage,
)
from core.models.outbox import EventCursor
from core.models.tenancy import (
    ApiToken,
    Membership,
    QosClass,
    Role,
    SlaContract,
    Team,
    TeamInvitation,
    TeamQuota,
    User,
    team_qos_classes,
)
from core.models.webhooks import Webhook, WebhookDelivery

__all__ = [
    "GPU",
    "ApiToken",
    "Artifact",
    "Attempt",
    "Checkpoint",
    "CheckpointExport",
    "Dataset",
    "Deployment",
    "Event",
    "EventCursor",
    "Forecast",
    "Host",
    "Job",
    "JobDependency",
    "JobMetric",
    "Membership",
    "QosClass",
    "Role",
    "SchedulerLease",
    "SlaContract",
    "Sweep",
    "Team",
    "TeamInvitation",
    "TeamQuota",
    "Usage",
    "User",
    "Webhook",
    "WebhookDelivery",
    "team_qos_classes",
]
