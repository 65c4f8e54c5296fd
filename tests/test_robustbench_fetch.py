"""RobustBench weights fetched, never from the real network: RobustBench's own download function (gdown, over
requests) is pointed at a file server on 127.0.0.1 serving files made here; without a network (name lookups and
connections to anything but this machine refused) one error line says which file to put where, also where
setuptools has no pkg_resources. A file is in place only once it is whole: a web page, a cut transfer or a
refused download leaves nothing behind."""
from __future__ import annotations

import http.server
import json
import shlex
import sys
import threading

import pytest

from fastfair import cli
from fastfair.evaluation import robustbench as rb
from fastfair.evaluation.foreign import file_sha256
from helpers import block_network, cifar_layout_npz, needs_extra, write_model

needs_extra("robustbench")  # its package __init__ needs what fastfair does not: no import

NAME = "Ding2020MMA"  # the smallest single model of RobustBench's CIFAR-10 Linf list


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    block_network(monkeypatch)


@pytest.fixture
def server(monkeypatch):
    """{Google Drive ID: (bytes, what the server claims their length is)} served on 127.0.0.1, and RobustBench's
    gdown asked for that ID gets it from there (the address is the only thing changed)."""
    files: dict[str, tuple[bytes, int]] = {}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body, length = files[self.path.lstrip("/")]
            self.send_response(200)
            self.send_header("Content-Type", "text/html" if body.startswith(b"<") else "application/octet-stream")
            self.send_header("Content-Length", str(length))
            self.end_headers()
            self.wfile.write(body)  # fewer bytes than claimed: the connection closes mid-file

        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    gdown = rb._import("robustbench.utils").gdown
    real = gdown.download
    monkeypatch.setattr(gdown, "download", lambda id, output, **kw: real(
        url=f"http://127.0.0.1:{httpd.server_port}/{id}", output=output, quiet=True))
    yield files
    httpd.shutdown()
    httpd.server_close()


def drive_id(name: str = NAME) -> str:
    return rb.entry(name, "cifar10", "Linf")["gdrive_id"]


@pytest.fixture(scope="module")
def weights(tmp_path_factory):
    """A randomly initialised Ding2020MMA in RobustBench's file format (its bytes) and a made-up CIFAR-10 npz."""
    tmp = tmp_path_factory.mktemp("served")
    write_model(tmp, NAME)
    return rb.model_file(NAME, model_dir=tmp).read_bytes(), cifar_layout_npz(tmp, test_per_class=1)


def leftovers(folder):
    return sorted(p.name for p in folder.rglob("*") if p.is_file()) if folder.exists() else []


def test_eval_fetches_missing_weights_and_evaluates_them_per_class(server, weights, tmp_path, capsys):
    data, npz = weights
    server[drive_id()] = (data, len(data))
    models = tmp_path / "models"
    assert cli.main(["eval", f"rb:{NAME}", "--model-dir", str(models), "--data-dir", str(npz),
                     "--attacks", "clean"]) == 0
    out = capsys.readouterr().out
    path = rb.model_file(NAME, model_dir=models)
    assert f"fetching {NAME}'s weights from {rb.DRIVE.format(drive_id())} to {path}" in out
    assert path.read_bytes() == data and leftovers(path.parent) == [f"{NAME}-test.json", path.name]  # no temporary
    record = json.loads((path.parent / "eval" / f"{NAME}-test.json").read_text())
    assert record["source"]["sha256"] == file_sha256(path) and len(record["results"]["clean"]["per_class"]) == 10


def test_the_suggested_fetch_command_fetches(server, weights, tmp_path, capsys):
    """The command a missing file's message names (here reproduce's, for its RobustBench row) does the fetching."""
    from fastfair.reproduce import runs

    models = tmp_path / "models"
    said = runs._robustbench_missing(NAME, str(models))
    command = shlex.split(said.split("`")[1])
    assert command[:2] == ["fastfair", "zoo"] and str(rb.model_file(NAME, model_dir=models).resolve()) in said
    data, _ = weights
    server[drive_id()] = (data, len(data))
    assert cli.main(command[1:]) == 0
    assert rb.model_file(NAME, model_dir=models).read_bytes() == data
    assert "1 models: 0 were here, 1 fetched" in capsys.readouterr().out
    assert cli.main(command[1:]) == 0 and "1 models: 1 were here, 0 fetched" in capsys.readouterr().out


@pytest.mark.parametrize("body, says", [
    (b"<!DOCTYPE html><html><title>Google Drive - Quota exceeded</title>", "is not a torch.save file"),
    ("cut", "ended early"),
])
def test_a_web_page_or_a_cut_transfer_leaves_nothing(server, weights, tmp_path, capsys, body, says):
    data, _ = weights
    server[drive_id()] = (data[: len(data) // 2], len(data)) if body == "cut" else (body, len(body))
    models = tmp_path / "models"
    assert cli.main(["zoo", "--fetch", "--models", NAME, "--model-dir", str(models)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fastfair: error:") and says in err and err.count("\n") == 1
    assert str(rb.model_file(NAME, model_dir=models).resolve()) in err
    assert leftovers(models) == []


def test_offline_one_line_names_the_file_and_where_it_goes_without_pkg_resources(tmp_path, monkeypatch, capsys):
    """No network and a setuptools without pkg_resources (>= 82): RobustBench's download code is still what runs,
    and its failure is one line naming the Drive file and the path to save it as."""
    for name in [m for m in sys.modules if m == "robustbench" or m.startswith("robustbench.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "pkg_resources", None)
    models = tmp_path / "models"
    assert cli.main(["eval", f"rb:{NAME}", "--model-dir", str(models), "--data-dir",
                     str(cifar_layout_npz(tmp_path))]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"fastfair: error: could not fetch {NAME}'s weights (ConnectionError")
    assert err.count("\n") == 1
    assert rb.DRIVE.format(drive_id()) in err and str(rb.model_file(NAME, model_dir=models).resolve()) in err
    assert leftovers(models) == []


@pytest.mark.parametrize("argv, says", [
    (["--fetch"], "--fetch: name the models"),
    (["--fetch", "--run", "--models", NAME], "--run fetches the weights it needs itself"),
    (["--fetch", "--models", NAME, "--out", "x"], "--out: only with --run"),
    (["--fetch", "--models", "Chen2020Adversarial"], "is an ensemble"),
    (["--fetch", "--models", "Debenedetti2022Light_XCiT-S12"], "come with timm's pretrained models"),
])
def test_fetch_mistakes_are_one_line(tmp_path, capsys, argv, says):
    assert cli.main(["zoo", "--model-dir", str(tmp_path), *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fastfair: error:") and says in err and err.count("\n") == 1
    assert leftovers(tmp_path) == []
