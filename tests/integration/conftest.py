"""Integration tier: the real local control plane, the operator as a real process, the test agent.

Every module here sets ``pytestmark = pytest.mark.cluster``. Resources send their probe to the
agent's node (``support.specs.make_spec``), so the probe that runs is the real
``mmprep-runtime probe`` on a real processor folder; runtime Deployments land on KWOK's simulated
GPU/CPU nodes unless a test tolerates the agent's taint on purpose (a pod that must really serve).
The fixtures themselves live in tests/conftest.py, shared with the other tiers.
"""
