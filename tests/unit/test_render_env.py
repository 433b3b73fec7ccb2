"""The environment renderer and the env file format."""

from __future__ import annotations

import pytest

from fstrain.core.render import EnvVar, format_env_file, render_env
from fstrain.errors import ConfigError


def as_dict(env: tuple[EnvVar, ...]) -> dict[str, str]:
    return {var.name: var.value for var in env}


def test_minimal_env_has_async_error_handling_and_the_flight_recorder() -> None:
    env = render_env()
    assert as_dict(env) == {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1", "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000"}
    assert "deprecated NCCL_ASYNC_ERROR_HANDLING" in env[0].reason


def test_full_env() -> None:
    env = render_env(ifname="ens1f0np0", rdma_devices=["mlx5_1", "mlx5_0", "mlx5_1"],
                     nccl_topo_file="/runs/r1/topo.xml")
    assert as_dict(env) == {
        "GLOO_SOCKET_IFNAME": "ens1f0np0",
        "NCCL_IB_HCA": "=mlx5_0,mlx5_1",
        "NCCL_SOCKET_IFNAME": "ens1f0np0",
        "NCCL_TOPO_FILE": "/runs/r1/topo.xml",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
        "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000",
    }
    assert [var.name for var in env] == sorted(var.name for var in env)
    assert all(var.reason for var in env)
    assert "NCCL_ASYNC_ERROR_HANDLING" not in as_dict(env)


def test_debug_env() -> None:
    env = as_dict(render_env(debug=True))
    assert (env["NCCL_DEBUG"], env["TORCH_DISTRIBUTED_DEBUG"], env["TORCH_CPP_LOG_LEVEL"]) == ("INFO", "DETAIL", "INFO")
    assert "NCCL_DEBUG" not in as_dict(render_env(debug=False))


def test_env_file_has_a_reason_above_every_variable() -> None:
    text = format_env_file(render_env(ifname="eth0", debug=True))
    lines = text.splitlines()
    assert text.endswith("\n")
    assignments = [i for i, line in enumerate(lines) if "=" in line and not line.startswith("#")]
    assert len(assignments) == 7
    for index in assignments:
        assert lines[index - 1].startswith("# ") and len(lines[index - 1]) > 10
    assert "GLOO_SOCKET_IFNAME=eth0" in lines


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"ifname": "eth0; rm -rf /"}, "not a device name"),
        ({"ifname": ""}, "not a device name"),
        ({"rdma_devices": ["mlx5 0"]}, "not a device name"),
        ({"nccl_topo_file": "topo.xml"}, "absolute path"),
    ],
)
def test_bad_inputs_are_refused(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        render_env(**kwargs)  # type: ignore[arg-type]


def test_a_value_that_cannot_be_written_is_refused() -> None:
    with pytest.raises(ConfigError, match="cannot write"):
        format_env_file([EnvVar("NCCL_TOPO_FILE", "/my runs/topo.xml", "x")])
