"""Arms and grids: every arm's config is derived from the base and validated at generation."""

import pytest

from pd_probe import (
    Arm,
    GridError,
    ProbeError,
    make_grid,
    parse_arm,
    standard_grid,
)


def _standard(toy, **kwargs):
    kwargs.setdefault("chunk_counts", (1, 2, 4))
    return standard_grid(
        toy.base,
        validate=toy.validate,
        layers_override=toy.layers_override,
        chunks_override=toy.chunks_override,
        layer_slices=(2, 4),
        chunk_loop_arms=[
            Arm(name="loop_scan", overrides="recon.loop=scan", equivalence="chunk_loop"),
            Arm(name="loop_unroll", overrides="recon.loop=unroll", equivalence="chunk_loop"),
        ],
        init_arms=[
            Arm(name="init_stacked", overrides="init.mode=stacked"),
            Arm(name="init_per_array", overrides="init.mode=per_array"),
        ],
        baseline_meta={"layers": 4, "chunks": 2},
        free_form=["runtime.compiler_options"],
        **kwargs,
    )


def test_standard_grid_every_arm_valid_and_derived(toy):
    grid = _standard(toy, extra_arms=[parse_arm("opt:runtime.compiler_options.xla_foo=3")])
    assert grid.names == (
        "baseline",
        "layers_2",
        "layers_4",
        "chunks_1",
        "chunks_2",
        "chunks_4",
        "loop_scan",
        "loop_unroll",
        "init_stacked",
        "init_per_array",
        "autotune_0",
        "autotune_2",
        "autotune_4",
        "cache_off",
        "cache_on",
        "opt",
    )
    for name, config in grid.configs.items():
        toy.validate(config)  # the grid holds only configs the schema accepts
        assert config["model"] == toy.base["model"], name
    assert grid.configs["layers_2"]["decomposition"]["layers"] == [0, 1]
    assert grid.configs["layers_2"]["recon"]["sites_per_chunk"] == 7
    assert grid.configs["chunks_4"]["recon"]["sites_per_chunk"] == 7
    assert grid.configs["loop_unroll"]["recon"]["loop"] == "unroll"
    assert grid.configs["opt"]["runtime"]["compiler_options"] == {"xla_foo": 3}
    assert grid.configs["baseline"] == toy.base
    assert grid.arm("layers_2").meta == {"layers": 2}
    assert grid.arm("chunks_4").meta == {"chunks": 4}
    assert grid.arm("autotune_2").gpu_only
    assert grid.arm("autotune_2").env == {"XLA_FLAGS": "--xla_gpu_autotune_level=2"}
    assert grid.arm("cache_on").repeats == 2


def test_identical_arms_become_aliases(toy):
    grid = _standard(toy)
    # layers_4, chunks_2, loop_scan and init_stacked are the base config itself.
    assert grid.aliases == {
        "layers_4": "baseline",
        "chunks_2": "baseline",
        "loop_scan": "baseline",
        "init_stacked": "baseline",
    }
    assert _standard(toy, dedupe=False).aliases == {}


def test_bad_override_fails_at_generation_with_arm_and_field_path(toy):
    with pytest.raises(GridError) as info:
        _standard(toy, extra_arms=[parse_arm("typo:runtime.compiler_option.xla_foo=3")])
    message = str(info.value)
    assert "arm 'typo'" in message
    assert "runtime.compiler_option does not exist" in message


def test_schema_failure_is_reraised_naming_arm_and_field(toy):
    with pytest.raises(GridError) as info:
        _standard(toy, extra_arms=[parse_arm("sideways:recon.loop=sideways")])
    message = str(info.value)
    assert "arm 'sideways'" in message
    assert "$.recon" in message  # the schema's own field path
    # A cross-field check from the schema, reached through a builder.
    with pytest.raises(GridError, match=r"arm 'chunks_3'.*recon\.sites_per_chunk = 9"):
        _standard(toy, chunk_counts=(3,))


def test_builder_failure_names_the_arm(toy):
    def broken(n):
        raise KeyError(n)

    with pytest.raises(GridError, match=r"arm 'layers_2': its override builder failed for 2"):
        standard_grid(toy.base, validate=toy.validate, layers_override=broken, layer_slices=(2,))


def test_select_keeps_baseline_and_alias_targets(toy):
    grid = _standard(toy)
    small = grid.select(["layers_2", "layers_4", "autotune_0"], include_gpu_only=False)
    assert small.names == ("baseline", "layers_2", "layers_4")
    assert small.aliases == {"layers_4": "baseline"}
    with pytest.raises(GridError, match=r"unknown arm.*nope"):
        grid.select(["nope"])


def test_make_grid_rejects_duplicate_names_and_missing_baseline(toy):
    with pytest.raises(GridError, match="appears twice"):
        make_grid(toy.base, [Arm(name="baseline"), Arm(name="baseline")], validate=None)
    with pytest.raises(GridError, match="baseline arm 'baseline' is not among"):
        make_grid(toy.base, [Arm(name="a")], validate=None)


def test_config_with_applies_and_validates(toy):
    grid = _standard(toy)
    config = grid.config_with("layers_2", {"runtime.cache_dir": "/tmp/c"})
    assert config["runtime"]["cache_dir"] == "/tmp/c"
    assert grid.configs["layers_2"]["runtime"]["cache_dir"] is None
    with pytest.raises(GridError, match=r"arm 'layers_2'.*runtime\.nope does not exist"):
        grid.config_with("layers_2", {"runtime.nope": 1})


def test_parse_arm_spec():
    arm = parse_arm("u8:recon.loop=unroll; recon.sites_per_chunk=7;$XLA_FLAGS=--a=1 --b;@chunks=4")
    assert arm.name == "u8"
    assert [(o.path, o.value) for o in arm.overrides] == [
        ("recon.loop", "unroll"),
        ("recon.sites_per_chunk", 7),
    ]
    assert arm.env == {"XLA_FLAGS": "--a=1 --b"}
    assert arm.meta == {"chunks": 4}
    assert parse_arm("plain") == Arm(name="plain")
    with pytest.raises(ProbeError, match="has no '='"):
        parse_arm("x:recon.loop")


def test_arm_checks_and_round_trip():
    with pytest.raises(ProbeError, match="bad arm name"):
        Arm(name="a/b")
    with pytest.raises(ProbeError, match="bad environment variable name"):
        Arm(name="a", env={"1X": "y"})
    with pytest.raises(ProbeError, match="environment variable X: value None"):
        Arm(name="a", env={"X": None})
    with pytest.raises(ProbeError, match="repeats = 0: must be positive"):
        Arm(name="a", repeats=0)
    arm = Arm(
        name="a",
        overrides={"x.y[0]": [1, 2]},
        env={"JAX_ENABLE_X64": True, "N": 3},
        meta={"layers": 2},
        equivalence="g",
    )
    assert arm.env == {"JAX_ENABLE_X64": "true", "N": "3"}
    assert Arm.from_dict(arm.to_dict()) == arm
