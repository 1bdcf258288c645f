"""Put requirements-gpu.txt's resolved stack on a GPU machine that has no network, as the machine's description
(bench/gpu_machine.toml) says: resolve it here for that machine's Python and platform, download the wheels it lacks,
cut them into parts one run can carry; there, gather the parts and install them into one folder.

    python bench/gpu_stack.py pack                    # here: .gpu/stack/parts/01, 02, ... (and the wheels, cached)
    python bench/gpu_stack.py pack --stack cuda12     # another known set: .gpu/stack-cuda12/parts/...
    python3 bench/gpu_stack.py receive .gpu/stack/parts/01   # there, once a run, each part carried with its run;
                                                             # the last one installs and prints the PYTHONPATH
    python3 bench/gpu_stack.py path                   # there: the PYTHONPATH once installed (exit 1 if not yet)

pip's resolver does the work here (--dry-run --report), so what runs there is exactly what `pip install -r
requirements-gpu.txt` resolves, less what the description keeps from the machine's own packages; there, the wheels
are unpacked into one folder as `pip install --no-deps --target` would, on every core.
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import itertools
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tomllib
import urllib.request
import zipfile
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path, PurePosixPath

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the kit's known sets, from this checkout, before the kit is installed there
from agentenv_nb.host.stacks import KEEP, STACKS  # noqa: E402
MACHINE = ROOT / "bench" / "gpu_machine.toml"
WORK = ROOT / ".gpu" / "stack"


def machine(path: Path = MACHINE) -> dict:
    return tomllib.loads(path.read_text())


def target_args(desc: dict) -> list[str]:
    """pip's options resolving for the machine: its Python, and every manylinux tag its glibc takes."""
    major, minor = map(int, desc["glibc"].split("."))
    tags = [f"manylinux_{major}_{n}_x86_64" for n in range(5, minor + 1)]
    tags += ["manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64", "linux_x86_64"]
    return ["--only-binary=:all:", "--python-version", desc["python"], "--implementation", "cp",
            *[arg for tag in tags for arg in ("--platform", tag)]]


def resolve(desc: dict, requirements: list[str], no_deps: bool) -> list[dict]:
    """What pip would install on the machine: [{name, version, url, sha256}]."""
    report = WORK / ("report-no-deps.json" if no_deps else "report.json")
    WORK.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--dry-run", "--ignore-installed",
                    "--target", str(WORK / "resolve-target"), "--report", str(report), *target_args(desc),
                    *(["--no-deps"] if no_deps else []), *requirements], check=True)
    return [{"name": item["metadata"]["name"], "version": item["metadata"]["version"],
             "url": item["download_info"]["url"], "sha256": item["download_info"]["archive_info"]["hashes"]["sha256"]}
            for item in json.loads(report.read_text())["install"]]


def kept(dist: dict, desc: dict) -> str | None:
    """Why the machine's own copy serves for ``dist``, or None when it must be carried."""
    name = dist["name"].lower().replace("_", "-")
    if name in desc["carry_anyway"]:
        return None
    if any(fnmatch.fnmatch(name, pattern) for pattern in desc["unused"]):
        return "unused on the kit's path"
    for rule in desc["keep"]:
        pattern, _, version = rule.partition("==")
        if fnmatch.fnmatch(name, pattern) and version in ("", dist["version"]):
            return "the machine's own"
    return None


def download(dist: dict, wheels: Path) -> Path:
    """The wheel, downloaded once and checked against the index's sha256."""
    path = wheels / dist["url"].rsplit("/", 1)[-1]
    if not (path.exists() and sha256(path) == dist["sha256"]):
        with urllib.request.urlopen(dist["url"], timeout=600) as response, open(path.with_suffix(".part"), "wb") as f:
            shutil.copyfileobj(response, f, 1 << 20)
        path.with_suffix(".part").rename(path)
        if sha256(path) != dist["sha256"]:
            raise SystemExit(f"gpu_stack: {path.name} doesn't match the index's sha256")
    return path


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def for_stack(desc: dict, name: str) -> tuple[dict, list[str], Path]:
    """The machine's description as ``name``'s set needs it, that set's pins, and where its parts go. The machine's
    own CUDA libraries serve a set of their CUDA major only (``keep_for_cuda``). A set that keeps the runtime's torch
    keeps the machine's own (``own_torch``), and carries none of the libraries a newer torch needs."""
    stack = STACKS[name]
    major = (stack.cuda or tuple(map(int, desc["cuda"].split("."))))[0]
    work = WORK if name == "cuda13" else WORK.with_name(f"stack-{name}")
    desc = {**desc, "keep": [*desc["keep"], *desc["keep_for_cuda"].get(str(major), [])]}
    if stack.changes.get("torch") != KEEP:
        carried = [*desc["carry_anyway"], *desc["carry_with_a_new_torch"]]
        return {**desc, "carry_anyway": carried}, stack.requirements(), work
    torch = desc["own_torch"][0].split("==")[1]
    if stack.keeps_torch and not torch.startswith(f"{stack.keeps_torch}."):
        raise SystemExit(f"gpu_stack: the '{name}' set keeps a runtime's torch {stack.keeps_torch}; the machine's own "
                         f"is {torch} (own_torch in {MACHINE.name})")
    return {**desc, "keep": [*desc["keep"], *desc["own_torch"]]}, stack.requirements(keep_torch=torch), work


def pack(args) -> None:
    global WORK
    desc, pins, WORK = for_stack(machine(args.machine), args.stack)
    dists = resolve(desc, [*pins, *desc["extra"]], no_deps=False) + resolve(desc, ["-r", str(ROOT / desc["no_deps_from"])], no_deps=True)
    carried = [d for d in dists if not kept(d, desc)]
    left = sorted(f"{d['name']}=={d['version']} ({kept(d, desc)})" for d in dists if kept(d, desc))
    print(f"gpu_stack: {len(dists)} distributions resolved; {len(left)} not carried:\n  " + "\n  ".join(left))
    wheels = WORK / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(8) as pool:
        files = list(pool.map(lambda d: download(d, wheels), carried))
    bundle = WORK / "stack.tar"
    with tarfile.open(bundle, "w") as tar:  # wheels are compressed already
        for path in files:
            tar.add(path, arcname=path.name)
    size, part = bundle.stat().st_size, desc["part_mib"] << 20
    count = -(-size // part)
    manifest = {"sha256": sha256(bundle), "bytes": size, "parts": count, "stack": args.stack,
                "wheels": sorted(f"{d['name']}=={d['version']}" for d in carried)}
    shutil.rmtree(WORK / "parts", ignore_errors=True)
    with open(bundle, "rb") as f:
        for index in range(1, count + 1):
            folder = WORK / "parts" / f"{index:02d}"
            folder.mkdir(parents=True)
            (folder / "chunk").write_bytes(f.read(part))
            (folder / "manifest.json").write_text(json.dumps({**manifest, "index": index}))
    bundle.unlink()
    print(f"gpu_stack: {len(carried)} wheels, {size / 2**20:.0f} MiB in {count} parts under {WORK / 'parts'}; "
          f"carry one a run: python3 bench/gpu_stack.py receive {(WORK / 'parts').relative_to(ROOT)}/NN")


def site_of(desc: dict, stack: str) -> Path:
    """Where ``stack``'s parts gather and it is installed on the machine: one folder a set."""
    return Path(desc["site"] + ("" if stack == "cuda13" else f"-{stack}"))


def receive(args) -> None:
    desc = machine(args.machine)
    part = Path(args.part)
    manifest = json.loads((part / "manifest.json").read_text())
    site = site_of(desc, manifest.get("stack", "cuda13"))
    gathered = site / "parts"
    mine = gathered / "manifest.json"
    if mine.exists() and json.loads(mine.read_text())["sha256"] != manifest["sha256"]:
        print("gpu_stack: these parts belong to another pack than those already here: starting over")
        shutil.rmtree(site)
    gathered.mkdir(parents=True, exist_ok=True)
    shutil.copy(part / "chunk", gathered / f"{manifest['index']:02d}")
    mine.write_text(json.dumps({k: v for k, v in manifest.items() if k != "index"}))
    have = sorted(p.name for p in gathered.iterdir() if p.name != "manifest.json")
    print(f"gpu_stack: {len(have)} of {manifest['parts']} parts here")
    if len(have) == manifest["parts"]:
        install(site, manifest)


def install(site: Path, manifest: dict) -> None:
    whole = site / "stack.tar"
    with open(whole, "wb") as out:
        for index in range(1, manifest["parts"] + 1):
            with open(site / "parts" / f"{index:02d}", "rb") as f:
                shutil.copyfileobj(f, out, 1 << 20)
    if sha256(whole) != manifest["sha256"]:
        shutil.rmtree(site / "parts")
        raise SystemExit("gpu_stack: the gathered parts are damaged: send them again")
    wheels, target = site / "wheels", site / "site-packages"
    with tarfile.open(whole) as tar:
        tar.extractall(wheels, filter="data")
    shutil.rmtree(target, ignore_errors=True)
    every = sorted(wheels.iterdir())
    # Every folder made here, by one process: where two processes made the same folder at once (the wheels share
    # nvidia/, cuda/), one of them failed, and on this file system a folder just made by another can be briefly unseen
    for folder in sorted({folder for wheel in every for folder in folders(wheel)}):
        (target / folder).mkdir(parents=True, exist_ok=True)
    with ProcessPoolExecutor() as pool:  # the machine's cores, where pip --target took 139 s on one
        list(pool.map(unpack, every, itertools.repeat(target)))
    for wheel in every:
        place_data(wheel, target)
    # Compiled as pip compiles what it installs, so a source's SyntaxWarning (torchao's) is pip's to hide, not the
    # first import's to print
    subprocess.run([sys.executable, "-W", "ignore", "-m", "compileall", "-q", "-j", "0", str(target)], check=True,
                   stdout=subprocess.DEVNULL)
    (site / "installed.json").write_text(json.dumps(manifest["wheels"]))
    # The parts go only once it is installed: if installing fails, receiving the last part again retries it
    for done in (whole, site / "parts", wheels):
        done.unlink() if done.is_file() else shutil.rmtree(done)
    print(f"gpu_stack: installed {len(manifest['wheels'])} wheels; PYTHONPATH={target}")


def folders(wheel: Path) -> set[PurePosixPath]:
    """The folders ``wheel``'s files go in, each relative to where it is installed."""
    with zipfile.ZipFile(wheel) as archive:
        names = [(PurePosixPath(m.filename), m.is_dir()) for m in archive.infolist()]
    if any(name.is_absolute() or ".." in name.parts for name, _ in names):
        raise SystemExit(f"gpu_stack: {wheel.name} names a file outside its folder")
    return {name if is_dir else name.parent for name, is_dir in names}


def unpack(wheel: Path, target: Path) -> None:
    """``wheel``'s files into ``target`` as pip's --target puts them, less its console scripts (nothing there runs
    them), into folders made already."""
    with zipfile.ZipFile(wheel) as archive:
        for member in archive.infolist():
            path = archive.extract(member, target)
            if member.external_attr >> 16 & 0o111:  # triton's ptxas among them: zipfile drops the mode
                os.chmod(path, 0o755)


def place_data(wheel: Path, target: Path) -> None:
    """``wheel``'s .data folder's scripts, headers and data where pip puts them."""
    places = {"purelib": "", "platlib": "", "scripts": "bin", "headers": "include", "data": ""}
    for data in target.glob(f"{wheel.name.split('-')[0]}-*.data"):
        for kind in data.iterdir():
            shutil.copytree(kind, target / places[kind.name], dirs_exist_ok=True)
        shutil.rmtree(data)


def path(args) -> None:
    site = site_of(machine(args.machine), args.stack)
    if not (site / "installed.json").exists():
        raise SystemExit(1)
    print(site / "site-packages")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="bench/gpu_stack.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--machine", type=Path, default=MACHINE, help="the machine's description (TOML)")
    commands = parser.add_subparsers(dest="command", required=True)
    packing = commands.add_parser("pack", help="resolve, download and cut the stack into parts (here)")
    packing.add_argument("--stack", choices=sorted(STACKS), default="cuda13",
                         help="the known set (agentenv_nb.host.stacks; default: requirements-gpu.txt's cuda13)")
    part = commands.add_parser("receive", help="take one part; the last one installs (there)")
    part.add_argument("part", help="a folder that pack made, carried with this run")
    where = commands.add_parser("path", help="print the PYTHONPATH of the installed stack (there)")
    where.add_argument("--stack", choices=sorted(STACKS), default="cuda13")
    args = parser.parse_args(argv)
    os.umask(0o022)
    {"pack": pack, "receive": receive, "path": path}[args.command](args)


if __name__ == "__main__":
    main()
