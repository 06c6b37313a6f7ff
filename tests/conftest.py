"""Shared fixtures: a tiny demo corpus and model, trained once per test session.

The model is trained with the project's own scripts (prepare_demo_data.sh,
train_demo.sh) in the WMT14 En-Fr big architecture at tiny dimensions.
Set HEADPRUNE_TEST_CACHE to a directory to reuse it across sessions.
"""

import contextlib
import fcntl
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
USER_DIR = str(REPO / "fairseq_headprune")
BIN_DIR = Path(sys.executable).parent

TINY_MODEL_ENV = {
    "SCALE": "0.4",  # 8000 training pairs
    "LAYERS": "2",
    "EMBED_DIM": "64",
    "FFN_DIM": "128",
    "HEADS": "8",
    "EPOCHS": "8",
    "WARMUP": "100",
    "LR": "0.003",
    "MAX_TOKENS": "2048",
}


def headprune_launcher(ranks):
    """The command prefix of fairseq-headprune in one process, or under torchrun with ``ranks`` CPU ranks."""
    if ranks == 1:
        return ["fairseq-headprune"]
    return [BIN_DIR / "torchrun", "--standalone", "--nproc-per-node", str(ranks), BIN_DIR / "fairseq-headprune"]


class _ForkServer:
    """``tests/fork_server.py`` for this test process, started at its first ``fairseq-headprune`` command: each
    command then runs in a child forked from a process that has its imports done (HEADPRUNE_TEST_FORK=0: each in
    a fresh interpreter instead)."""

    process = None

    @classmethod
    def run(cls, argv, env, cwd) -> subprocess.CompletedProcess:
        import tempfile

        if cls.process is None or cls.process.poll() is not None:
            cls.process = subprocess.Popen([sys.executable, str(REPO / "tests" / "fork_server.py")], cwd=REPO,
                                           stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        with tempfile.TemporaryDirectory(prefix="headprune-command-") as outputs:
            files = {name: os.path.join(outputs, name) for name in ("stdout", "stderr")}
            cls.process.stdin.write(json.dumps({"argv": argv, "env": env, "cwd": str(cwd), **files}) + "\n")
            cls.process.stdin.flush()
            answer = cls.process.stdout.readline()
            assert answer, "tests/fork_server.py ended"
            printed = {name: open(path, encoding="utf-8", errors="replace").read() for name, path in files.items()}
        return subprocess.CompletedProcess(["fairseq-headprune", *argv], json.loads(answer)["status"],
                                           printed["stdout"], printed["stderr"])


def run(command, env=None, check=True, cwd=REPO):
    """Run a command with this interpreter's bin directory first on PATH; ``fairseq-headprune`` in a process forked
    from one with its imports done (``_ForkServer``)."""
    full_env = dict(os.environ)
    full_env["PATH"] = f"{BIN_DIR}{os.pathsep}{full_env.get('PATH', '')}"
    full_env.update(env or {})
    command = [str(c) for c in command]
    if command[0] == "fairseq-headprune" and full_env.get("HEADPRUNE_TEST_FORK", "1") != "0":
        result = _ForkServer.run(command[1:], full_env, cwd)
    else:
        result = subprocess.run(command, cwd=cwd, env=full_env, capture_output=True, text=True)
    if check and result.returncode != 0:
        raise AssertionError(
            f"{' '.join(map(str, command))} exited {result.returncode}\n"
            f"stdout:\n{result.stdout[-3000:]}\nstderr:\n{result.stderr[-3000:]}"
        )
    return result


def run_in_process(argv, capsys):
    """``fairseq-headprune ARGV`` through the command line's own ``main`` in this process (no interpreter to start,
    torch and fairseq already imported): a ``subprocess.CompletedProcess`` of its exit status and output, for the
    refusals, which end before any model is loaded."""
    import torch

    from fairseq_headprune import cli

    capsys.readouterr()
    threads = torch.get_num_threads()
    try:
        status = cli.main([str(a) for a in argv])
    except SystemExit as exit:  # argparse's own errors
        status = exit.code
    finally:
        torch.set_num_threads(threads)  # what a command sets for itself, not for the tests after it
    captured = capsys.readouterr()
    return subprocess.CompletedProcess(argv, status, captured.out, captured.err)


def kill_once_written(command, path, timeout=900):
    """Start ``command`` in a session of its own and SIGKILL it (its children too) as soon as ``path`` exists: a run
    killed mid-way, for the resumption tests; fails if the command ended first."""
    process = subprocess.Popen([str(c) for c in command], cwd=REPO, start_new_session=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + timeout
    while not path.exists() and process.poll() is None and time.time() < deadline:
        time.sleep(0.1)
    assert process.poll() is None, f"{' '.join(map(str, command[:2]))} ended before {path} was written"
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def validate_loss(tiny_model, *extra):
    """Validation loss that fairseq-validate reports with the fairseq-headprune task."""
    result = run(
        ["fairseq-validate", tiny_model["data"], "--path", tiny_model["checkpoint"],
         "--user-dir", USER_DIR, "--task", "fairseq-headprune", "--valid-subset", "valid",
         "--batch-size", "64", *extra]
    )
    return float(re.search(r"\| loss ([\d.]+)", result.stdout + result.stderr).group(1))


def zeroed_copy(model, head_mask):
    """A copy of ``model`` with the masked heads' output-projection columns zeroed (the reference for masks)."""
    import copy

    from fairseq_headprune.modules.masked_multihead_attention import attention_modules

    zeroed = copy.deepcopy(model)
    for (attention_type, layer), module in attention_modules(zeroed).items():
        for head, xi in enumerate(head_mask[attention_type][layer].tolist()):
            if xi == 0.0:
                module.out_proj.weight.data[:, head * module.head_dim:(head + 1) * module.head_dim] = 0.0
    return zeroed


def save_zeroed_checkpoint(checkpoint, layer_prefix, heads, mask, path):
    """``checkpoint`` with heads zeroed in out_proj, written to ``path``: the stock-fairseq reference.

    ``layer_prefix`` names a layer's attention (``"decoder.layers.{}.self_attn."``),
    ``mask`` is its (layers, heads) tensor, 0 for the heads to zero.
    """
    import torch

    import fairseq_headprune.compat.torch_load  # noqa: F401  (its allow-list lets torch.load read checkpoints)

    state = torch.load(checkpoint, map_location="cpu")
    for layer in range(mask.size(0)):
        weight = state["model"][layer_prefix.format(layer) + "out_proj.weight"]
        head_dim = weight.size(1) // heads
        for head in range(heads):
            if mask[layer, head] == 0:
                weight[:, head * head_dim:(head + 1) * head_dim] = 0
    torch.save(state, path)
    return path


def shared_root(tmp_path_factory, name, cached=True):
    """Where a trained fixture lives: HEADPRUNE_TEST_CACHE/name if set (and ``cached``), else one directory per
    test session.

    Under pytest-xdist every worker has its own base temp directory; their common parent is the session's, so
    the workers find one another's models there instead of each training its own.
    """
    cache = os.environ.get("HEADPRUNE_TEST_CACHE")
    if cache and cached:
        return Path(cache) / name
    base = tmp_path_factory.getbasetemp()
    return (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / name


@contextlib.contextmanager
def built_once(root):
    """Hold an exclusive lock on ``root`` while the caller checks for (and else builds) what it keeps there.

    A second pytest-xdist worker that needs the same model waits here until the first has built it.
    """
    root.mkdir(parents=True, exist_ok=True)
    with open(root.parent / f".{root.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield root
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    """Paths of a tiny trained model: data dir (bin), raw text dir, checkpoint."""
    cache = os.environ.get("HEADPRUNE_TEST_CACHE")
    # the cache directory itself holds the tiny model (kept so for caches made before other models joined it)
    root = Path(cache) if cache else shared_root(tmp_path_factory, "tiny_model")
    checkpoint = root / "checkpoints" / "checkpoint_last.pt"
    with built_once(root):
        if not checkpoint.exists():
            run(["bash", REPO / "scripts" / "data" / "prepare_demo_data.sh", root], env=TINY_MODEL_ENV)
            run(
                ["bash", REPO / "scripts" / "train" / "train_demo.sh", root / "bin", root / "checkpoints"],
                env=TINY_MODEL_ENV,
            )
    return {"data": root / "bin", "raw": root / "raw", "checkpoint": checkpoint, "root": root}


@pytest.fixture(scope="session")
def tiny_task_and_model(tiny_model):
    """The tiny model loaded through the fairseq-headprune task, in eval mode."""
    from fairseq import checkpoint_utils, options, tasks, utils
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    import fairseq_headprune.registry

    # what fairseq's --user-dir does, also when the package was imported before fairseq
    fairseq_headprune.registry.register_components()
    utils.import_user_module(type("Args", (), {"user_dir": USER_DIR})())
    parser = options.get_generation_parser()
    args = options.parse_args_and_arch(
        parser,
        [str(tiny_model["data"]), "--task", "fairseq-headprune", "--user-dir", USER_DIR],
    )
    cfg = convert_namespace_to_omegaconf(args)
    task = tasks.setup_task(cfg.task)
    models, _ = checkpoint_utils.load_model_ensemble([str(tiny_model["checkpoint"])], task=task)
    model = models[0].eval()
    return task, model


# fixtures that train a model with the project's scripts (minutes each): tests that use one,
# directly or through another fixture, belong to the full tier only (-m "not slow" leaves them out)
TRAINING_FIXTURES = {"tiny_model", "tiny_lm", "classifier", "mnli_dir", "wmt_dir"}



# the longest test files first (seconds on 2 cores), so that under pytest-xdist (--dist loadfile
# --no-loadscope-reorder) no long file starts last; the first two train what most others use while the next two
# build their own models
LONGEST_FIRST = ("test_compress.py", "test_roberta_mnli_pipeline.py", "test_layer_drop.py", "test_wmt_pipeline.py",
                 "test_joint_search.py",
                 "test_prune_cli.py", "test_ablate_cli.py", "test_ffn_mask.py", "test_budhraja_finetune.py",
                 "test_budhraja_long.py", "test_language_model.py", "test_sharding.py", "test_sentence_prediction.py",
                 "test_checkpoint_compat.py", "test_fairseq_cli.py", "test_export.py", "test_deployment_timing.py")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if TRAINING_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
    rank = {name: position for position, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: a file's tests keep their order


@pytest.fixture(scope="session")
def neuron_scores(tiny_model, tmp_path_factory):
    """Fisher scores of the tiny model's heads (with blocks) and FFN neurons, from the importance command."""
    # computed by this session's code, never kept between sessions
    out = shared_root(tmp_path_factory, "neuron_scores", cached=False)
    with built_once(out):
        if not (out / "importance.json").exists():
            run(["fairseq-headprune", "importance", tiny_model["data"], "--path", tiny_model["checkpoint"],
                 "--importance-method", "fisher", "--importance-structures", "heads,ffn", "--importance-limit", "32",
                 "--out-dir", out, "--no-progress"])
    return out / "importance.json"


@pytest.fixture(scope="session")
def heads_only_scores(neuron_scores, tmp_path_factory):
    """The same Fisher file without its FFN neuron scores: what a heads-only importance run writes."""
    payload = json.loads(neuron_scores.read_text())
    del payload["neuron_importance"]
    path = tmp_path_factory.mktemp("heads_only") / "heads_only.json"
    path.write_text(json.dumps(payload))
    return path


def counted_flops_per_token(model, positions=32):
    """FLOPs per token of every attention layer keeping k heads and every FFN layer, by torch's FlopCounterMode.

    Each attention layer is narrowed to its first k heads (k = 1 .. H) and run on an unfused path with the
    attention weights returned, whose explicit matrix products the counter sees, on ``positions`` positions
    attending to as many; each FFN layer runs fc1 and fc2 on as many positions. An independent count of what
    ``model_flops`` prices.
    """
    import copy

    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from fairseq_headprune.modules.masked_ffn import ffn_layers
    from fairseq_headprune.modules.masked_multihead_attention import attention_modules, unfused_attention
    from fairseq_headprune.modules.pruned_heads import shrink_attention

    counted = {}
    for key, module in attention_modules(model).items():
        x = torch.randn(positions, 1, module.out_proj.out_features)
        counted[key] = []
        for kept in range(1, module.num_heads + 1):
            narrowed = copy.deepcopy(module)
            shrink_attention(narrowed, list(range(kept)))
            # need_weights: the explicit products (an unnarrowed module would otherwise take torch's fused
            # CPU attention kernel, whose FLOPs the counter does not see)
            with torch.no_grad(), unfused_attention(), FlopCounterMode(display=False) as counter:
                narrowed(x, x, x, need_weights=True)
            counted[key].append(counter.get_total_flops() / positions)
    for key, layer in ffn_layers(model).items():
        x = torch.randn(positions, 1, layer.fc1.in_features)
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            layer.fc2(layer.activation_fn(layer.fc1(x)))
        counted[key] = counter.get_total_flops() / positions
    return counted


@pytest.fixture(scope="session")
def tiny_flops(tiny_task_and_model):
    """The tiny model's FLOPs per token (32 positions) counted by torch: every layer, a head, a neuron, the whole."""
    counted = counted_flops_per_token(tiny_task_and_model[1], 32)
    head = counted[("enc-enc", 0)][0]
    neuron = counted[("enc-ffn", 0)] / tiny_task_and_model[1].encoder.layers[0].fc1.out_features
    total = sum(value[-1] if isinstance(value, list) else value for value in counted.values())
    return {"layers": counted, "head": head, "neuron": neuron, "total": total}
