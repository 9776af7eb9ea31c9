"""The server's deployment beacon (docs/deployments.md): a server records its deployment
when it starts and keeps its ``last_seen`` fresh while it runs, as a worker's heartbeat
does for the worker's."""

from __future__ import annotations

from veracity.models import DeploymentRecord
from veracity.store.protocol import MaintenanceStore


class DeploymentBeacon:
    name = "deployments"

    def __init__(self, store: MaintenanceStore, deployment_id: str) -> None:
        self.store = store
        self.deployment_id = deployment_id

    async def run_once(self) -> DeploymentRecord:
        return await self.store.deployment_seen(self.deployment_id)
