"""Fixtures of the operator tests: the operator's client to a fake Kubernetes API (kmock, real HTTP)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import kmock as km
import pytest
from kelvin_operator.k8s import OperatorKube

from scheduler_plugin.kubeapi import KubeClient, KubeConfig


@pytest.fixture
async def kube(kmock: km.KubernetesEmulator) -> AsyncIterator[OperatorKube]:
    client = KubeClient(KubeConfig(server=str(kmock.url)), timeout_s=5.0)
    yield OperatorKube(client)
    await client.close()
