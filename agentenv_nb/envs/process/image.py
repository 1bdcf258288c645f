"""An env image read as a local process: its build context unpacked in the work folder, laid out by its Dockerfile
(``dockerfile``) and its requirements checked against this Python, so a plain-Python MCP server runs without Docker.
``read_image`` blocks: call it off the event loop."""

from __future__ import annotations

import shutil
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path

from agent_env.config import get_config
from agent_env.utils.docker.context import extract

from agentenv_nb.envs.process.dockerfile import ImageError, read_dockerfile
from agentenv_nb.envs.workdir import owned_prefix, share_with_envs, work_dir
from agentenv_nb.envs.process.zygote import outside_imports


@dataclass(frozen=True)
class EnvImage:
    """What a process runs: its WORKDIR's folder, CMD script and args, ENV, and the outside modules its code imports."""

    key: str
    app_dir: Path
    script: Path
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    preload: tuple[str, ...] = ()


_images: dict[str, EnvImage] = {}
_lock = threading.Lock()


def read_image(image, *, pip_install: bool = False) -> EnvImage:
    """The image a ``DockerImageArtifact`` with a build context describes, read once per source digest."""
    if not image.build_context_object_url or not image.dockerfile_path:
        raise ImageError(f"image {image.image_name!r} has no build context with a Dockerfile; a process sandbox runs "
                         "only an env built from a bundle's envs/<name>/Dockerfile")
    url = image.build_context_object_url
    key = image.source_digest or f"{url}#{image.dockerfile_path}"
    with _lock:
        if key in _images:
            return _images[key]
        work = Path(tempfile.mkdtemp(prefix=owned_prefix("image"), dir=work_dir()))
        try:
            share_with_envs(work)  # env processes read their app from it
            archive, context, app = work / "context.tar.gz", work / "context", work / "app"
            get_config().get_object_store_at(url).download_to_file(url, str(archive))
            extract(archive, context)
            archive.unlink()
            where = f"image {image.id!r} ({image.dockerfile_path})"
            read = read_dockerfile(where, context, app, image.dockerfile_path, pip_install)
            return _images.setdefault(key, EnvImage(key, app, read.script, read.args, read.env, outside_imports(app)))
        except BaseException:
            shutil.rmtree(work, ignore_errors=True)
            raise


def remove_images(keys: set[str] | None = None) -> None:
    """Remove the folders ``read_image`` unpacked, those of ``keys`` or all; a later read unpacks again."""
    with _lock:
        for key in list(_images) if keys is None else keys & set(_images):
            shutil.rmtree(_images.pop(key).app_dir.parent, ignore_errors=True)


