"""Where remote log segments are kept: Kafka's ``RemoteStorageManager`` (KIP-405), over a directory or S3.

A remote log segment is a closed local segment copied whole, with the files a
reader of it needs: its ``.log``, offset index, time index, transaction index,
producer snapshot and the leader-epoch entries that cover it.  Each copy gets a
unique id (:class:`RemoteLogSegmentId`), so a copy retried after a crash never
overwrites the objects of an earlier attempt: the metadata log
(:mod:`engine.remote.metadata`) says which attempt finished, and the others
are orphans that :meth:`RemoteStorageManager.list_segment_ids` finds.

Object layout (one prefix per store, shared by any number of data dirs)::

    PREFIX/TOPIC-TOPIC_ID/PARTITION/BASE_OFFSET-ID.log
    PREFIX/TOPIC-TOPIC_ID/PARTITION/BASE_OFFSET-ID.index
    PREFIX/TOPIC-TOPIC_ID/PARTITION/BASE_OFFSET-ID.timeindex
    PREFIX/TOPIC-TOPIC_ID/PARTITION/BASE_OFFSET-ID.txnindex    (empty when no transaction aborted in it)
    PREFIX/TOPIC-TOPIC_ID/PARTITION/BASE_OFFSET-ID.snapshot    (the producers at its end)
    PREFIX/TOPIC-TOPIC_ID/PARTITION/BASE_OFFSET-ID.leader-epoch-checkpoint

``TOPIC_ID`` is the topic's id (``partition.metadata``, as Kafka keys remote
segments by ``TopicIdPartition``): two data dirs, or a topic deleted and
created again under its name, never share a directory of the store.
``BASE_OFFSET`` is the segment's, 20 digits as in its local file names, and
``ID`` a random UUID (hex).  The ``.log`` object is written last: a copy whose
``.log`` is there has all its other objects.

Every failure of the store is a :class:`RemoteStorageError` naming the store
and the object: ``ETIMEDOUT`` when it did not answer within the bound the store
was opened with, ``EACCES`` when it refused the credentials, ``ENOENT`` for a
missing object or bucket, ``EIO`` otherwise.  Nothing here retries beyond the
client's own bounded retries: the caller (the copy task, a read) decides.
"""

from __future__ import annotations

import enum
import errno as _errno
import os
import shutil
import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from engine.errors import InvalidConfigError, LogfsError
from engine.files import TMP_FILE_SUFFIX, atomic_write, fsync_dir

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping


class RemoteStorageError(LogfsError):
    """The remote store failed an operation (its errno says how; the message names the store and object)."""

    def __init__(self, message: str, errno: int = _errno.EIO) -> None:
        super().__init__(message)
        self.errno = errno


class IndexType(enum.Enum):
    """The files of a remote segment besides its ``.log`` (Kafka's ``RemoteStorageManager.IndexType``)."""

    OFFSET = "index"
    TIMESTAMP = "timeindex"
    TRANSACTION = "txnindex"
    PRODUCER_SNAPSHOT = "snapshot"
    LEADER_EPOCH = "leader-epoch-checkpoint"


#: the suffix of a segment's ``.log`` object
LOG_SUFFIX = "log"


@dataclass(frozen=True, order=True)
class TopicIdPartition:
    """A partition of one incarnation of a topic (Kafka's ``TopicIdPartition``)."""

    topic: str
    topic_id: str
    partition: int

    @property
    def directory(self) -> str:
        """The partition's directory below the store's prefix."""
        return f"{self.topic}-{self.topic_id}/{self.partition}"

    def __str__(self) -> str:
        return f"{self.topic}-{self.partition} (topic ID {self.topic_id})"


@dataclass(frozen=True, order=True)
class RemoteLogSegmentId:
    """One copy of one segment: its partition, base offset and the copy's unique id."""

    topic_id_partition: TopicIdPartition
    base_offset: int
    id: str

    @classmethod
    def generate(cls, tip: TopicIdPartition, base_offset: int) -> RemoteLogSegmentId:
        return cls(tip, base_offset, uuid.uuid4().hex)

    @property
    def partition_dir(self) -> str:
        return self.topic_id_partition.directory

    def object_name(self, suffix: str) -> str:
        """The object's key below the store's prefix."""
        return f"{self.partition_dir}/{self.base_offset:020d}-{self.id}.{suffix}"


@dataclass(frozen=True)
class LogSegmentData:
    """The local files of a closed segment to copy (Kafka's ``LogSegmentData``).

    ``leader_epoch_index`` is the content of the leader-epoch entries that
    cover the segment (the replica keeps epochs in its batches, so they are
    built by the caller), never a file to read.  The transaction index and the
    producer snapshot are a local path or their content (logfs writes neither
    file beside its segments: the copy task builds them,
    ``engine.transactions``); None leaves the object out, as Kafka's optional
    transaction index.
    """

    log_segment: str
    offset_index: str
    time_index: str
    transaction_index: str | bytes | None
    producer_snapshot_index: str | bytes | None
    leader_epoch_index: bytes

    def files(self) -> Iterator[tuple[str, str | bytes]]:
        """(suffix, local path or content) of each object, the ``.log`` last."""
        yield IndexType.OFFSET.value, self.offset_index
        yield IndexType.TIMESTAMP.value, self.time_index
        if self.transaction_index is not None:
            yield IndexType.TRANSACTION.value, self.transaction_index
        if self.producer_snapshot_index is not None:
            yield IndexType.PRODUCER_SNAPSHOT.value, self.producer_snapshot_index
        yield IndexType.LEADER_EPOCH.value, self.leader_epoch_index
        yield LOG_SUFFIX, self.log_segment


class RemoteStorageManager(ABC):
    """Copies segments to a store, reads them back by byte range and deletes them.

    Thread-safe: the copy task and any number of readers use one instance.
    """

    #: how the store is named in messages (``s3://bucket/prefix``, ``file:///dir``)
    uri: str

    @abstractmethod
    def _put(self, name: str, source: str | bytes) -> None:
        """Store ``source`` (a local path or bytes) as object ``name``, replacing nothing else."""

    @abstractmethod
    def _get(self, name: str, start: int, end: int | None) -> bytes:
        """Bytes ``[start, end)`` of object ``name`` (to its end when ``end`` is None)."""

    @abstractmethod
    def _delete(self, names: list[str]) -> None:
        """Delete the objects (a missing one is no error)."""

    @abstractmethod
    def _list(self, directory: str) -> list[str]:
        """The names of the objects below ``directory/``."""

    @abstractmethod
    def check(self) -> None:
        """Raise RemoteStorageError unless the store answers and takes writes (called when it is opened)."""

    def close(self) -> None:  # noqa: B027 (a store with nothing to release keeps this)
        """Release what the store holds (connections)."""

    # ---------------------------------------------------------- Kafka's interface
    def copy_log_segment_data(self, segment_id: RemoteLogSegmentId, data: LogSegmentData) -> None:
        """Store every file of the segment under ``segment_id``, the ``.log`` last (idempotent)."""
        for suffix, source in data.files():
            self._put(segment_id.object_name(suffix), source)

    def fetch_log_segment(self, segment_id: RemoteLogSegmentId, start_position: int,
                          end_position: int | None = None) -> bytes:
        """Bytes ``[start_position, end_position)`` of the segment's ``.log``."""
        return self._get(segment_id.object_name(LOG_SUFFIX), start_position, end_position)

    def fetch_index(self, segment_id: RemoteLogSegmentId, index_type: IndexType) -> bytes:
        return self._get(segment_id.object_name(index_type.value), 0, None)

    def delete_log_segment_data(self, segment_id: RemoteLogSegmentId) -> None:
        """Delete every object of the copy, the ``.log`` first (idempotent)."""
        names = [segment_id.object_name(LOG_SUFFIX)]
        names += [segment_id.object_name(t.value) for t in IndexType]
        self._delete(names)

    def list_segment_ids(self, tip: TopicIdPartition) -> set[RemoteLogSegmentId]:
        """Every copy with a ``.log`` object in the store for the partition (finished or orphaned)."""
        return {sid for sid, suffixes in self.list_objects(tip).items() if LOG_SUFFIX in suffixes}

    def list_objects(self, tip: TopicIdPartition) -> dict[RemoteLogSegmentId, set[str]]:
        """Every copy with an object in the store for the partition, and the suffixes of its objects."""
        found: dict[RemoteLogSegmentId, set[str]] = {}
        for name in self._list(tip.directory):
            stem, _, suffix = name.rpartition("/")[2].partition(".")
            base, _, copy_id = stem.partition("-")
            if suffix and base.isdigit() and copy_id:
                found.setdefault(RemoteLogSegmentId(tip, int(base), copy_id), set()).add(suffix)
        return found


class FileRemoteStorage(RemoteStorageManager):
    """A directory as the store (``file:///DIR``; Kafka's ``LocalTieredStorage`` for tests).

    Each object is a file written to a temporary name, fsynced and renamed, so
    a crash leaves either the whole object or none, and at most that temporary
    file, deleted with the copy's objects (a copy cut by a crash is deleted
    at the next mount's first round).
    """

    def __init__(self, root: str) -> None:
        self.root = os.path.abspath(root)
        self.uri = f"file://{self.root}"

    def _path(self, name: str) -> str:
        return os.path.join(self.root, name)

    def check(self) -> None:
        if not os.path.isdir(self.root):
            raise RemoteStorageError(f"Remote storage {self.uri} does not exist (rsm.config.uri)", _errno.ENOENT)
        if not os.access(self.root, os.W_OK | os.X_OK):
            raise RemoteStorageError(f"Remote storage {self.uri} is not writable (rsm.config.uri)", _errno.EACCES)

    def _put(self, name: str, source: str | bytes) -> None:
        path = self._path(name)
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            if isinstance(source, bytes):
                atomic_write(path, source)
            else:
                tmp = path + TMP_FILE_SUFFIX
                shutil.copyfile(source, tmp)
                with open(tmp, "rb+") as f:
                    os.fsync(f.fileno())
                os.replace(tmp, path)
                fsync_dir(os.path.dirname(path))
        except OSError as exc:
            raise RemoteStorageError(f"Could not copy {name} to remote storage {self.uri}: {exc.strerror}",
                                     exc.errno or _errno.EIO) from exc

    def _get(self, name: str, start: int, end: int | None) -> bytes:
        try:
            with open(self._path(name), "rb") as f:
                f.seek(start)
                return f.read() if end is None else f.read(max(0, end - start))
        except OSError as exc:
            raise RemoteStorageError(f"Could not read {name} from remote storage {self.uri}: {exc.strerror}",
                                     exc.errno or _errno.EIO) from exc

    def _delete(self, names: list[str]) -> None:
        # the temporary file of a put cut by a crash goes with its object
        for path in (p for name in names for p in (self._path(name), self._path(name) + TMP_FILE_SUFFIX)):
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
            except OSError as exc:
                raise RemoteStorageError(f"Could not delete {path} from remote storage {self.uri}: "
                                         f"{exc.strerror}", exc.errno or _errno.EIO) from exc

    def _list(self, directory: str) -> list[str]:
        try:
            return [f"{directory}/{n}" for n in os.listdir(self._path(directory))
                    if not n.endswith(TMP_FILE_SUFFIX)]
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise RemoteStorageError(f"Could not list {directory} in remote storage {self.uri}: {exc.strerror}",
                                     exc.errno or _errno.EIO) from exc


class S3RemoteStorage(RemoteStorageManager):
    """An S3 bucket (AWS or any S3-compatible server) as the store, through boto3.

    Every request is bounded: ``timeout_s`` for connecting and for each read,
    with the client's standard retries (``max_attempts``) inside it, so a store
    that is down fails a call within about ``timeout_s * max_attempts``.
    """

    def __init__(self, bucket: str, prefix: str, *, endpoint_url: str | None = None, region: str | None = None,
                 access_key_id: str | None = None, secret_access_key: str | None = None,
                 timeout_s: float = 10.0, max_attempts: int = 2) -> None:
        import boto3  # the tiered mount's dependency, loaded only when used
        from botocore.config import Config

        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.uri = f"s3://{bucket}/{self.prefix}" if self.prefix else f"s3://{bucket}"
        # Any: boto3 builds its client at run time
        self._client: Any = boto3.session.Session().client(
            "s3", endpoint_url=endpoint_url, region_name=region or "us-east-1",
            aws_access_key_id=access_key_id, aws_secret_access_key=secret_access_key,
            config=Config(connect_timeout=timeout_s, read_timeout=timeout_s,
                          retries={"max_attempts": max_attempts, "mode": "standard"}))
        self._endpoint = endpoint_url or "AWS"

    def _key(self, name: str) -> str:
        return f"{self.prefix}/{name}" if self.prefix else name

    def _error(self, what: str, exc: Exception) -> RemoteStorageError:
        from botocore.exceptions import ClientError, ConnectTimeoutError, EndpointConnectionError, ReadTimeoutError

        where = f"remote storage {self.uri} at {self._endpoint}"
        if isinstance(exc, (ConnectTimeoutError, ReadTimeoutError)):
            return RemoteStorageError(f"{what}: {where} did not answer in time ({exc})", _errno.ETIMEDOUT)
        if isinstance(exc, EndpointConnectionError):
            return RemoteStorageError(f"{what}: {where} cannot be reached ({exc}); check "
                                      "rsm.config.s3.endpoint.url", _errno.ETIMEDOUT)
        if isinstance(exc, ClientError):
            code = str(exc.response.get("Error", {}).get("Code", ""))
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if code in ("403", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch") or status == 403:
                return RemoteStorageError(f"{what}: {where} refused the credentials ({code}); check "
                                          "rsm.config.s3.access.key.id and rsm.config.s3.secret.access.key",
                                          _errno.EACCES)
            if code in ("404", "NoSuchBucket", "NoSuchKey") or status == 404:
                hint = "; check the bucket of rsm.config.uri" if code in ("404", "NoSuchBucket") else ""
                return RemoteStorageError(f"{what}: {where} has no such {code or 'object'}{hint}", _errno.ENOENT)
        return RemoteStorageError(f"{what}: {where} failed: {exc}", _errno.EIO)

    def check(self) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            self._client.head_bucket(Bucket=self.bucket)
        except (BotoCoreError, ClientError) as exc:
            raise self._error(f"Could not open bucket {self.bucket}", exc) from exc
        # a key that may read but not write fails here, at the mount, not at the first copy
        probe = self._key(f".logfs-probe-{uuid.uuid4().hex}")
        try:
            self._client.put_object(Bucket=self.bucket, Key=probe, Body=b"")
            self._client.delete_object(Bucket=self.bucket, Key=probe)
        except (BotoCoreError, ClientError) as exc:
            raise self._error(f"Could not write to bucket {self.bucket}", exc) from exc

    def _put(self, name: str, source: str | bytes) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            if isinstance(source, bytes):
                self._client.put_object(Bucket=self.bucket, Key=self._key(name), Body=source)
            else:
                with open(source, "rb") as f:
                    self._client.put_object(Bucket=self.bucket, Key=self._key(name), Body=f)
        except OSError as exc:
            raise RemoteStorageError(f"Could not read {source!s} to copy it to {self.uri}: {exc.strerror}",
                                     exc.errno or _errno.EIO) from exc
        except (BotoCoreError, ClientError) as exc:
            raise self._error(f"Could not copy {name}", exc) from exc

    def _get(self, name: str, start: int, end: int | None) -> bytes:
        from botocore.exceptions import BotoCoreError, ClientError

        if end is not None and end <= start:
            return b""
        byte_range = f"bytes={start}-" if end is None else f"bytes={start}-{end - 1}"
        try:
            body = self._client.get_object(Bucket=self.bucket, Key=self._key(name), Range=byte_range)["Body"]
            try:
                data: bytes = body.read()
            finally:
                body.close()
            return data
        except (BotoCoreError, ClientError) as exc:
            if isinstance(exc, ClientError) and exc.response.get("Error", {}).get("Code") == "InvalidRange":
                return b""      # at or past the object's end
            raise self._error(f"Could not read {name}", exc) from exc

    def _delete(self, names: list[str]) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            for name in names:
                self._client.delete_object(Bucket=self.bucket, Key=self._key(name))
        except (BotoCoreError, ClientError) as exc:
            raise self._error(f"Could not delete {names[0]}", exc) from exc

    def _list(self, directory: str) -> list[str]:
        from botocore.exceptions import BotoCoreError, ClientError

        prefix = self._key(directory) + "/"
        names = []
        try:
            for page in self._client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix):
                for item in page.get("Contents", ()):
                    key = item["Key"]
                    names.append(key[len(self.prefix) + 1:] if self.prefix else key)
        except (BotoCoreError, ClientError) as exc:
            raise self._error(f"Could not list {directory}", exc) from exc
        return names

    def close(self) -> None:
        self._client.close()


#: the mount settings of the store, under Kafka's plugin prefix
RSM_URI = "rsm.config.uri"
RSM_ENDPOINT = "rsm.config.s3.endpoint.url"
RSM_REGION = "rsm.config.s3.region"
RSM_ACCESS_KEY = "rsm.config.s3.access.key.id"
RSM_SECRET_KEY = "rsm.config.s3.secret.access.key"
RSM_TIMEOUT_MS = "rsm.config.request.timeout.ms"
#: the bound of the local chunk cache of remote reads, and its chunk size (the names of Aiven's
#: RemoteStorageManager for Kafka, the common plugin)
RSM_CACHE_SIZE = "rsm.config.fetch.chunk.cache.size"
RSM_CHUNK_SIZE = "rsm.config.chunk.size"
RSM_SETTINGS = (RSM_URI, RSM_ENDPOINT, RSM_REGION, RSM_ACCESS_KEY, RSM_SECRET_KEY, RSM_TIMEOUT_MS, RSM_CACHE_SIZE,
                RSM_CHUNK_SIZE)
#: the settings whose values never reach a log line
RSM_SECRETS = (RSM_SECRET_KEY,)
DEFAULT_CACHE_SIZE = 256 << 20
DEFAULT_CHUNK_SIZE = 4 << 20


def chunk_cache_bounds(settings: Mapping[str, str]) -> tuple[int, int]:
    """(the cache's bound, its chunk size) in bytes, from the ``rsm.config.*`` settings.

    InvalidConfigError names the setting that is not a positive number, or a
    bound smaller than one chunk.
    """
    values = []
    for name, default in ((RSM_CACHE_SIZE, DEFAULT_CACHE_SIZE), (RSM_CHUNK_SIZE, DEFAULT_CHUNK_SIZE)):
        text = settings.get(name, str(default)).strip()
        if not text.isdigit() or int(text) <= 0:
            raise InvalidConfigError(f"{name} must be a positive number of bytes, not {text!r}")
        values.append(int(text))
    cache, chunk = values
    if cache < chunk:
        raise InvalidConfigError(f"{RSM_CACHE_SIZE}={cache} must hold at least one chunk ({RSM_CHUNK_SIZE}={chunk})")
    return cache, chunk


def open_remote_storage(settings: Mapping[str, str]) -> RemoteStorageManager:
    """The store ``settings`` (the ``rsm.config.*`` mount settings) name, checked to answer and take writes.

    ``InvalidConfigError`` names the setting that is wrong; ``RemoteStorageError``
    says why the store could not be opened.  Credentials not given fall back to
    boto3's own (the AWS environment variables and files).
    """
    unknown = sorted(k for k in settings if k.startswith("rsm.config.") and k not in RSM_SETTINGS)
    if unknown:
        raise InvalidConfigError(f"Unknown remote storage setting {unknown[0]} (known: {', '.join(RSM_SETTINGS)})")
    chunk_cache_bounds(settings)
    uri = settings.get(RSM_URI)
    if not uri:
        raise InvalidConfigError(f"{RSM_URI} must name the remote storage: s3://BUCKET/PREFIX or file:///DIR")
    timeout_ms = settings.get(RSM_TIMEOUT_MS, "10000")
    if not timeout_ms.isdigit() or int(timeout_ms) <= 0:
        raise InvalidConfigError(f"{RSM_TIMEOUT_MS} must be a positive number of milliseconds, not {timeout_ms!r}")
    parsed = urlparse(uri)
    store: RemoteStorageManager
    if parsed.scheme == "file":
        if parsed.netloc not in ("", "localhost") or not parsed.path:
            raise InvalidConfigError(f"{RSM_URI}={uri}: a file URI names a local directory, file:///DIR")
        store = FileRemoteStorage(parsed.path)
    elif parsed.scheme == "s3":
        if not parsed.netloc:
            raise InvalidConfigError(f"{RSM_URI}={uri} names no bucket: s3://BUCKET/PREFIX")
        store = S3RemoteStorage(parsed.netloc, parsed.path, endpoint_url=settings.get(RSM_ENDPOINT),
                                region=settings.get(RSM_REGION), access_key_id=settings.get(RSM_ACCESS_KEY),
                                secret_access_key=settings.get(RSM_SECRET_KEY),
                                timeout_s=int(timeout_ms) / 1000)
    else:
        raise InvalidConfigError(f"{RSM_URI}={uri}: the remote storage is s3://BUCKET/PREFIX or file:///DIR")
    try:
        store.check()
    except BaseException:
        store.close()
        raise
    return store
