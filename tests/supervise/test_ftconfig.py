"""FTConfig: the fault-tolerance config, validated on its own (one line naming the bad value)
and inside a JobSpec; reachable from the facade."""

import dataclasses

import pytest

from unbroken.supervise.spec import FTConfig, JobSpec, check


@pytest.mark.parametrize("kw, names", [
    ({"redundancy": 0}, "--redundancy 0"),
    ({"guard": "maybe"}, "--guard 'maybe'"),
    ({"sdc_every": -1}, "--sdc-every -1"),
    ({"ckpt_every": 0}, "--ckpt-every 0"),
    ({"spares": -1}, "--spares -1"),
    ({"spares": 1, "standby_p": 0.1}, "--spares and --standby-p"),
    ({"standby_p": 1.5}, "1.5"),
    ({"staleness": 0.05}, "--staleness 0.05"),
    ({"heartbeat": 0.0}, "heartbeat period 0.0"),
    ({"supervisor_staleness": 0.1}, "supervisor staleness 0.1"),
    ({"ladder": "no_such_key=1"}, "no_such_key"),
])
def test_a_bad_value_is_one_line_naming_it(kw, names):
    with pytest.raises(ValueError) as e:
        FTConfig(**kw).check()
    assert names in str(e.value)
    assert len(str(e.value).splitlines()) == 1
    with pytest.raises(ValueError) as e2:  # the job's check validates its FTConfig too
        check(JobSpec(trainer="mlp", ft=FTConfig(**kw)))
    assert str(e2.value) == str(e.value)


def test_defaults_are_valid_frozen_and_the_ladder_is_its_own():
    ft = FTConfig()
    ft.check()
    assert JobSpec(trainer="mlp").ft == ft
    with pytest.raises(dataclasses.FrozenInstanceError):
        ft.guard = "act"  # type: ignore[misc]
    assert ft.policy().update_deadline == 5.0
    assert FTConfig(ladder="update_deadline=9").policy().update_deadline == 9.0


def test_the_job_keeps_what_to_train_and_ft_how_to_keep_it_running():
    job = {f.name for f in dataclasses.fields(JobSpec)}
    ft = {f.name for f in dataclasses.fields(FTConfig)}
    assert not job & ft
    assert {"trainer", "steps", "out", "faults", "ft"} <= job
    assert {"redundancy", "staleness", "heartbeat", "guard", "ladder", "ckpt_every"} <= ft
    spec = JobSpec(trainer="mlp", chaos=0, ft=FTConfig(guard="act"))
    assert spec.ckpt_interval() == 10 and JobSpec(trainer="mlp").ckpt_interval() == 50
    assert JobSpec(trainer="mlp", ft=FTConfig(ckpt_every=7)).ckpt_interval() == 7


def test_the_facade_gives_ftconfig():
    import unbroken

    assert unbroken.FTConfig is FTConfig
    assert "FTConfig" in unbroken.__all__ and "FTConfig" in dir(unbroken)
    assert unbroken.JobSpec(trainer="mlp", ft=unbroken.FTConfig(guard="act")).ft.guard == "act"
