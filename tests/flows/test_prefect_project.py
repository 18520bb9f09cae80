"""prefect.yaml, read by Prefect's own loader: five deployments on the process pool, each entrypoint a flow that
loads, with the parameters it declares. ``tests/flows/test_workers.py`` runs ``prefect deploy --all`` on it."""

from __future__ import annotations

from pathlib import Path

from prefect.cli.deploy._config import _load_deploy_configs_and_actions
from prefect.flows import load_flow_from_entrypoint
from prefect.utilities.callables import parameter_schema
from rich.console import Console

REPO = Path(__file__).resolve().parents[2]


def test_prefect_yaml_declares_the_pipeline_deployments():
    console = Console(record=True)
    configs, actions = _load_deploy_configs_and_actions(REPO / "prefect.yaml", console=console)
    assert "Skipping" not in console.export_text()  # Prefect skips a file it cannot validate
    by_name = {config["name"]: config for config in configs}
    assert set(by_name) == {"rollout", "batch", "retry-failed", "rebuild-trajectories", "sft-generation"}
    assert all(config["work_pool"]["name"] == "polar-process" for config in configs)
    assert actions["pull"] == [
        {"prefect.deployments.steps.set_working_directory": {"directory": "{{ $POLAR_REPO_DIR }}"}}
    ]
    flows = {}
    for name, config in by_name.items():
        flow = load_flow_from_entrypoint(str(REPO / config["entrypoint"]))
        flows[name] = flow.name
        declared = set(config.get("parameters", {}))
        assert declared <= set(parameter_schema(flow).model_dump()["properties"]), name
    assert flows == {
        "rollout": "polar-rollout",
        "batch": "polar-batch",
        "retry-failed": "polar-retry-failed",
        "rebuild-trajectories": "polar-rebuild-trajectories",
        "sft-generation": "polar-sft-generation",
    }
    [schedule] = by_name["sft-generation"]["schedules"]
    # Deploying schedules nothing a user did not ask for: the daily run on the toy dataset ships inactive.
    assert schedule["cron"] == "0 3 * * *" and schedule["active"] is False
    assert all(s.get("active") is False for config in by_name.values() for s in config.get("schedules", []))
    dataset = REPO / by_name["sft-generation"]["parameters"]["dataset"]
    assert dataset.is_file()  # the default dataset ships with the repository
