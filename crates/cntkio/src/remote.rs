//! Objects in an object store as input files: `s3://bucket/key`, `gs://bucket/key`, `az://container/key`
//! and `http(s)://host/path`, read by ranged GETs through the `object_store` crate.
//!
//! An object's length, ETag and modification time come from a HEAD at open. Reads go through a small cache
//! of aligned blocks ([`BLOCK_LEN`] bytes, the [`BLOCKS_KEPT`] most recently used kept), so that a pass
//! reading a few KiB at a time costs one request per block; a read of a block or more is one request of
//! its own and is not cached. Every GET carries the ETag seen at open (`If-Match`), so an object replaced
//! while it is read is an error, not a mix of two versions.
//!
//! S3 is configured from the standard environment (`AWS_ENDPOINT_URL` or `AWS_ENDPOINT_URL_S3`,
//! `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`, `AWS_REGION` or
//! `AWS_DEFAULT_REGION`, `AWS_ALLOW_HTTP` for an `http://` endpoint), Google Cloud Storage and Azure from
//! theirs (`GOOGLE_*`, `AZURE_*`): a service-account file's `gcs_base_url` and `disable_oauth` point GCS at
//! a local server, `AZURE_STORAGE_USE_EMULATOR` and `AZURITE_BLOB_STORAGE_URL` point Azure at Azurite.
//! Transient failures (5xx answers, timeouts, connections refused or cut, a body cut mid-object) are retried
//! with backoff for up to [`RETRY_TIMEOUT`] (`CNTKIO_OBJECT_RETRY_TIMEOUT` seconds), a request given up after
//! `CNTKIO_OBJECT_TIMEOUT` seconds (default 30); object_store resumes a body cut mid-object with a ranged GET
//! for the rest, checked against the ETag. The requests run on one small tokio runtime for the process,
//! started at the first remote open (and started again in a forked child); the rest of the library stays
//! synchronous.

use crate::Error;
use bytes::Bytes;
use object_store::aws::AmazonS3ConfigKey;
use object_store::azure::AzureConfigKey;
use object_store::gcp::GoogleConfigKey;
use object_store::path::Path as ObjectPath;
use object_store::{ClientConfigKey, GetOptions, GetRange, ObjectStore, ObjectStoreExt, RetryConfig};
use std::collections::VecDeque;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

/// The length of a cached block.
pub const BLOCK_LEN: u64 = 8 << 20;
/// How many blocks an open object keeps.
pub const BLOCKS_KEPT: usize = 4;
/// How long a request is retried after a transient failure (a 5xx, a timeout, a cut connection) before
/// its error is reported.
pub const RETRY_TIMEOUT: Duration = Duration::from_secs(60);

/// The variable that sets how long a failed request is retried, in seconds ([`RETRY_TIMEOUT`] when unset).
pub const RETRY_TIMEOUT_VAR: &str = "CNTKIO_OBJECT_RETRY_TIMEOUT";
/// The variable that sets how long one request may take before it is given up (and retried), in seconds
/// (30 when unset, object_store's default).
pub const TIMEOUT_VAR: &str = "CNTKIO_OBJECT_TIMEOUT";

/// The variable that sets the part size of multipart uploads, in bytes ([`PART_LEN`] when unset; from
/// [`MIN_PART_LEN`] to [`MAX_PART_LEN`], S3's smallest and largest parts).
pub const PART_LEN_VAR: &str = "CNTKIO_OBJECT_PART_SIZE";
/// The length of an uploaded part (more for a file so large that its parts would pass [`MAX_PARTS`]).
pub const PART_LEN: u64 = 16 << 20;
/// The smallest part S3 takes (except the last).
pub const MIN_PART_LEN: u64 = 5 << 20;
/// The largest part S3 takes (a part is held in memory while it is sent).
pub const MAX_PART_LEN: u64 = 5 << 30;
/// The most parts an upload may have (S3's limit).
const MAX_PARTS: u64 = 10_000;
/// How many parts are sent at once.
const PARTS_IN_FLIGHT: usize = 4;

/// The URL schemes read as objects: S3 (`s3a://` is Hadoop's name for it), Google Cloud Storage, Azure
/// Blob Storage (`az://` and `azure://` as fsspec writes them, `abfs[s]://` as Hadoop does) and any web
/// server.
const SCHEMES: [&str; 9] =
    ["s3://", "s3a://", "gs://", "az://", "azure://", "abfs://", "abfss://", "http://", "https://"];

/// True if `path` names an object in an object store (`s3://…`, `gs://…`, `az://…`, `http(s)://…`, see
/// the module documentation) rather than a local file.
pub fn is_url(path: &std::path::Path) -> bool {
    path.to_str().is_some_and(|s| scheme_of(s, &SCHEMES).is_some())
}

fn scheme_of<'a>(s: &str, list: &[&'a str]) -> Option<&'a str> {
    list.iter().copied().find(|p| s.get(..p.len()).is_some_and(|h| h.eq_ignore_ascii_case(p)))
}

/// The process's runtime, with the id of the process that started it.
static RUNTIME: Mutex<Option<(u32, Arc<tokio::runtime::Runtime>)>> = Mutex::new(None);

pub(crate) fn runtime() -> Result<Arc<tokio::runtime::Runtime>, Error> {
    let mut slot = RUNTIME.lock().unwrap_or_else(PoisonError::into_inner);
    let pid = std::process::id();
    if let Some((owner, rt)) = &*slot {
        if *owner == pid {
            return Ok(rt.clone());
        }
    }
    // A runtime inherited through fork has no threads in this process: dropping it would wait for them.
    if let Some(stale) = slot.take() {
        std::mem::forget(stale);
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("cntkio-io")
        .enable_all()
        .build()
        .map_err(|e| Error::io("cannot start the object store client", e))?;
    let rt = Arc::new(rt);
    *slot = Some((pid, rt.clone()));
    Ok(rt)
}

/// An open object.
#[derive(Debug)]
pub(crate) struct Remote {
    url: String,
    store: Arc<dyn ObjectStore>,
    location: ObjectPath,
    len: u64,
    etag: Option<String>,
    modified: Option<SystemTime>,
    blocks: BlockCache,
}

impl Remote {
    /// Opens the object at `url` (one HEAD request).
    pub(crate) fn open(url: &str) -> Result<Remote, Error> {
        let (store, location) = store_for(url)?;
        Remote::with_store(url, store, location)
    }

    /// Opens `location` in `store`, shown as `url` in errors.
    pub(crate) fn with_store(url: &str, store: Arc<dyn ObjectStore>, location: ObjectPath) -> Result<Remote, Error> {
        let rt = runtime()?;
        let meta = rt.block_on(store.head(&location)).map_err(|e| error(url, "cannot open", e))?;
        Ok(Remote {
            url: url.to_owned(),
            store,
            location,
            len: meta.size,
            etag: meta.e_tag,
            modified: Some(meta.last_modified.into()),
            blocks: BlockCache::new(BLOCK_LEN, BLOCKS_KEPT),
        })
    }

    pub(crate) fn len(&self) -> u64 {
        self.len
    }
    pub(crate) fn modified(&self) -> Option<SystemTime> {
        self.modified
    }
    /// The ETag the object had at open, if the store gives one.
    pub(crate) fn etag(&self) -> Option<&str> {
        self.etag.as_deref()
    }
    /// How many GET requests reads have made.
    #[cfg(test)]
    pub(crate) fn requests(&self) -> u64 {
        self.blocks.fetches.load(Ordering::Relaxed)
    }

    /// Reads up to `buf.len()` bytes at `offset`; fewer only at the end of the object.
    pub(crate) fn read_some(&self, offset: u64, buf: &mut [u8]) -> Result<usize, Error> {
        let end = offset.saturating_add(buf.len() as u64).min(self.len);
        if offset >= end {
            return Ok(0);
        }
        self.blocks.read(offset..end, buf, &|r| self.get(r))
    }

    /// One ranged GET.
    fn get(&self, range: Range<u64>) -> Result<Bytes, Error> {
        let rt = runtime()?;
        let options = GetOptions {
            range: Some(GetRange::Bounded(range.clone())),
            if_match: self.etag.clone(),
            ..GetOptions::default()
        };
        let fetch = async {
            let result = self.store.get_opts(&self.location, options).await?;
            result.bytes().await
        };
        let op = format!("cannot read bytes {}..{} of", range.start, range.end);
        rt.block_on(fetch).map_err(|e| error(&self.url, &op, e))
    }
}

/// Uploads the file `file` to the object `url`: a file of one part or less by one PUT, a larger one by a
/// multipart upload of [`PART_LEN`]-byte parts, a few in flight, completed only after the last part, so
/// that nothing is visible at the object's key until the whole file is; an upload that fails (or is
/// cancelled by `cancel`, asked between parts) is aborted, its parts discarded. Returns the bytes sent.
pub(crate) fn upload(file: &std::path::Path, url: &str, cancel: Option<fn() -> bool>) -> Result<u64, Error> {
    let (store, location) = store_for(url)?;
    upload_to(url, store, &location, file, part_len()?, cancel)
}

/// Checks, before an output is written, what its upload to `url` will need: a URL its store takes, the
/// store's configuration, the part size (so that a mistake is reported before the conversion, not after).
pub(crate) fn check_output(url: &str) -> Result<(), Error> {
    store_for(url)?;
    part_len().map(|_| ())
}

/// The part size of uploads: `CNTKIO_OBJECT_PART_SIZE`, else [`PART_LEN`].
fn part_len() -> Result<u64, Error> {
    match std::env::var(PART_LEN_VAR) {
        Ok(v) if !v.trim().is_empty() => match v.trim().parse::<u64>() {
            Ok(n) if (MIN_PART_LEN..=MAX_PART_LEN).contains(&n) => Ok(n),
            _ => {
                let why = format!("must be a number of bytes from {MIN_PART_LEN} to {MAX_PART_LEN}");
                Err(Error::option_value(PART_LEN_VAR, v, why))
            }
        },
        _ => Ok(PART_LEN),
    }
}

fn upload_to(
    url: &str,
    store: Arc<dyn ObjectStore>,
    location: &ObjectPath,
    file: &std::path::Path,
    part_len: u64,
    cancel: Option<fn() -> bool>,
) -> Result<u64, Error> {
    use std::io::Read;
    let local = |e| Error::io(format!("cannot read {} to upload it to {url}", file.display()), e);
    let mut f = std::fs::File::open(file).map_err(local)?;
    let len = f.metadata().map_err(local)?.len();
    let rt = runtime()?;
    let failed = |e| error(url, "cannot write", e);
    // Whole parts of the file, the part size raised so that the parts stay within S3's count.
    let part_len = part_len.max(len.div_ceil(MAX_PARTS));
    let mut read_part = |n: u64| -> Result<Bytes, Error> {
        let mut buf = Vec::with_capacity(n as usize);
        (&mut f).take(n).read_to_end(&mut buf).map_err(local)?;
        if (buf.len() as u64) < n {
            let short = std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "the file shrank while it was uploaded");
            return Err(local(short));
        }
        Ok(Bytes::from(buf))
    };
    if len <= part_len {
        let bytes = read_part(len)?;
        // A PUT given up is dropped unfinished: the store keeps nothing of it.
        rt.block_on(unless_cancelled(store.put(location, bytes.into()), cancel))?.map_err(failed)?;
        return Ok(len);
    }
    let upload = rt.block_on(store.put_multipart(location)).map_err(failed)?;
    let mut parts = object_store::WriteMultipart::new_with_chunk_size(upload, part_len as usize);
    let mut sent = 0u64;
    let result = rt.block_on(async {
        while sent < len {
            unless_cancelled(parts.wait_for_capacity(PARTS_IN_FLIGHT), cancel).await?.map_err(failed)?;
            let part = read_part((len - sent).min(part_len))?;
            sent += part.len() as u64;
            parts.put(part);
        }
        // The last parts in flight, before the upload is completed.
        unless_cancelled(parts.wait_for_capacity(0), cancel).await?.map_err(failed)
    });
    match result {
        Ok(()) => rt.block_on(parts.finish()).map_err(failed).map(|_| len),
        Err(e) => {
            // Aborted, the parts sent are discarded (a failed abort leaves them to the bucket's lifecycle
            // rules; the object never appears either way).
            if let Err(abort) = rt.block_on(parts.abort()) {
                log::warn!("cannot abort the upload to {url}: {abort}");
            }
            Err(e)
        }
    }
}

/// How often a transfer asks its `cancel` hook whether to give up.
const CANCEL_POLL: Duration = Duration::from_millis(50);

/// Awaits `f` unless `cancel` says to stop first (asked before and every [`CANCEL_POLL`]): then `f` is
/// dropped unfinished and the error is [`crate::interrupted`].
async fn unless_cancelled<T>(
    f: impl std::future::Future<Output = T>,
    cancel: Option<fn() -> bool>,
) -> Result<T, Error> {
    let Some(cancel) = cancel else { return Ok(f.await) };
    let mut f = std::pin::pin!(f);
    loop {
        if cancel() {
            return Err(crate::interrupted());
        }
        if let Ok(out) = tokio::time::timeout(CANCEL_POLL, &mut f).await {
            return Ok(out);
        }
    }
}

/// The store and the object's path for `url`.
fn store_for(url: &str) -> Result<(Arc<dyn ObjectStore>, ObjectPath), Error> {
    let invalid = |why: String| {
        Error::io(format!("cannot open {url}"), std::io::Error::new(std::io::ErrorKind::InvalidInput, why))
    };
    let parsed = url::Url::parse(url).map_err(|e| invalid(format!("not a valid URL ({e})")))?;
    let retry = RetryConfig {
        retry_timeout: seconds_var(RETRY_TIMEOUT_VAR)?.unwrap_or(RETRY_TIMEOUT),
        ..RetryConfig::default()
    };
    // In the form object_store's configuration parses (humantime).
    let timeout = seconds_var(TIMEOUT_VAR)?.map(|d| format!("{}ms", d.as_millis().max(1)));
    let built = |e| error(url, "cannot open", e);
    // The key is the URL's path, percent-decoded (the URL parser encodes a space as `%20`).
    let location = ObjectPath::from_url_path(parsed.path()).map_err(|e| invalid(e.to_string()))?;
    let store: Arc<dyn ObjectStore> = match parsed.scheme() {
        "s3" | "s3a" => {
            let mut b = object_store::aws::AmazonS3Builder::from_env().with_url(url).with_retry(retry);
            if let Some(t) = timeout {
                b = b.with_config(AmazonS3ConfigKey::Client(ClientConfigKey::Timeout), t);
            }
            Arc::new(b.build().map_err(built)?)
        }
        "gs" => {
            let mut b = object_store::gcp::GoogleCloudStorageBuilder::from_env().with_url(url).with_retry(retry);
            if let Some(t) = timeout {
                b = b.with_config(GoogleConfigKey::Client(ClientConfigKey::Timeout), t);
            }
            Arc::new(b.build().map_err(built)?)
        }
        "az" | "azure" | "abfs" | "abfss" => {
            let mut b = object_store::azure::MicrosoftAzureBuilder::from_env().with_url(url).with_retry(retry);
            if let Some(t) = timeout {
                b = b.with_config(AzureConfigKey::Client(ClientConfigKey::Timeout), t);
            }
            Arc::new(b.build().map_err(built)?)
        }
        _ => {
            let origin = &parsed[..url::Position::BeforePath];
            let options = object_store::ClientOptions::new().with_allow_http(true);
            let mut b =
                object_store::http::HttpBuilder::new().with_url(origin).with_retry(retry).with_client_options(options);
            if let Some(t) = timeout {
                b = b.with_config(ClientConfigKey::Timeout, t);
            }
            Arc::new(b.build().map_err(built)?)
        }
    };
    Ok((store, location))
}

/// The duration in seconds (a decimal number, more than 0) that the environment variable `name` holds;
/// `None` when it is unset or empty.
fn seconds_var(name: &str) -> Result<Option<Duration>, Error> {
    let Some(value) = std::env::var_os(name) else { return Ok(None) };
    let text = value.to_string_lossy();
    if text.trim().is_empty() {
        return Ok(None);
    }
    match text.trim().parse::<f64>() {
        Ok(s) if s > 0.0 && s <= 1e9 => Ok(Some(Duration::from_secs_f64(s))),
        _ => Err(Error::option_value(name, text.into_owned(), "must be a number of seconds greater than 0")),
    }
}

/// The library's error for a failed request: an I/O error naming the URL whose kind tells a missing object
/// or a refusal apart (Python raises `NotFoundError` and `PermissionDeniedError` for them).
fn error(url: &str, op: &str, e: object_store::Error) -> Error {
    use object_store::Error as E;
    use std::io::ErrorKind as K;
    let (kind, why) = match &e {
        E::NotFound { .. } => (K::NotFound, "the object (or its bucket) does not exist".to_owned()),
        E::PermissionDenied { source, .. } => (K::PermissionDenied, format!("permission denied: {source}")),
        E::Unauthenticated { source, .. } => (K::PermissionDenied, format!("the credentials were refused: {source}")),
        E::Precondition { .. } => (K::Other, "the object was replaced while it was being read".to_owned()),
        other => (K::Other, other.to_string()),
    };
    Error::io(format!("{op} {url}"), std::io::Error::new(kind, why))
}

/// The most recently used aligned blocks of an object.
#[derive(Debug)]
pub(crate) struct BlockCache {
    block_len: u64,
    capacity: usize,
    /// Most recently used first: (block number, its bytes).
    blocks: Mutex<VecDeque<(u64, Bytes)>>,
    fetches: AtomicU64,
}

impl BlockCache {
    pub(crate) fn new(block_len: u64, capacity: usize) -> BlockCache {
        BlockCache { block_len, capacity, blocks: Mutex::new(VecDeque::new()), fetches: AtomicU64::new(0) }
    }

    /// Fills `buf` with the bytes of `range` (which ends at or before the object's end), fetching with
    /// `fetch`; returns how many bytes it had (fewer only if a fetch returned less than asked: the object
    /// shrank).
    pub(crate) fn read(
        &self,
        range: Range<u64>,
        buf: &mut [u8],
        fetch: &dyn Fn(Range<u64>) -> Result<Bytes, Error>,
    ) -> Result<usize, Error> {
        let want = (range.end - range.start) as usize;
        if range.end - range.start >= self.block_len {
            self.fetches.fetch_add(1, Ordering::Relaxed);
            let got = fetch(range)?;
            let n = got.len().min(want);
            buf[..n].copy_from_slice(&got[..n]);
            return Ok(n);
        }
        let mut done = 0usize;
        while done < want {
            let at = range.start + done as u64;
            let number = at / self.block_len;
            let block = self.block(number, fetch)?;
            let from = (at - number * self.block_len) as usize;
            let n = block.len().saturating_sub(from).min(want - done);
            if n == 0 {
                break;
            }
            buf[done..done + n].copy_from_slice(&block[from..from + n]);
            done += n;
        }
        Ok(done)
    }

    /// Block `number`, from the cache or fetched (the lock is not held during the fetch: two threads may
    /// fetch the same block, and the second copy is dropped).
    fn block(&self, number: u64, fetch: &dyn Fn(Range<u64>) -> Result<Bytes, Error>) -> Result<Bytes, Error> {
        {
            let mut blocks = self.blocks.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(hit) = blocks.iter().position(|(n, _)| *n == number).and_then(|i| blocks.remove(i)) {
                let bytes = hit.1.clone();
                blocks.push_front(hit);
                return Ok(bytes);
            }
        }
        self.fetches.fetch_add(1, Ordering::Relaxed);
        let start = number * self.block_len;
        let bytes = fetch(start..start + self.block_len)?;
        let mut blocks = self.blocks.lock().unwrap_or_else(PoisonError::into_inner);
        if !blocks.iter().any(|(n, _)| *n == number) {
            blocks.push_front((number, bytes.clone()));
            blocks.truncate(self.capacity);
        }
        Ok(bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use object_store::memory::InMemory;
    use object_store::PutPayload;

    fn object(len: usize) -> (Vec<u8>, Arc<dyn ObjectStore>, ObjectPath) {
        let data: Vec<u8> = (0..len).map(|i| (i * 7 + i / 251) as u8).collect();
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let location = ObjectPath::from("data/a.cbf");
        runtime().unwrap().block_on(store.put(&location, PutPayload::from(data.clone()))).unwrap();
        (data, store, location)
    }

    #[test]
    fn reads_equal_the_object_and_a_sequential_pass_costs_one_request_per_block() {
        let (data, store, location) = object(3 * BLOCK_LEN as usize + 12345);
        let remote = Remote::with_store("memory:///data/a.cbf", store, location).unwrap();
        assert_eq!(remote.len(), data.len() as u64);
        // 64 KiB reads from front to back, as a validation pass makes them.
        let mut pass = Vec::new();
        let mut buf = vec![0u8; 64 << 10];
        loop {
            let n = remote.read_some(pass.len() as u64, &mut buf).unwrap();
            if n == 0 {
                break;
            }
            pass.extend_from_slice(&buf[..n]);
        }
        assert!(pass == data, "the pass reads the object's bytes");
        assert_eq!(remote.requests(), 4, "one GET per 8 MiB block, the last one short");

        // Reads across a block boundary, and back into a kept block, cost no more requests.
        let mut two = vec![0u8; 100];
        let at = BLOCK_LEN * 2 - 50;
        assert_eq!(remote.read_some(at, &mut two).unwrap(), 100);
        assert!(two[..] == data[at as usize..at as usize + 100]);
        assert_eq!(remote.requests(), 4);

        // A read of a block or more is one request of its own; a read past the end is short, then empty.
        let mut big = vec![0u8; BLOCK_LEN as usize + 1];
        assert_eq!(remote.read_some(7, &mut big).unwrap(), big.len());
        assert!(big[..] == data[7..7 + big.len()]);
        assert_eq!(remote.requests(), 5);
        let mut tail = vec![0u8; 1000];
        assert_eq!(remote.read_some(data.len() as u64 - 10, &mut tail).unwrap(), 10);
        assert!(tail[..10] == data[data.len() - 10..]);
        assert_eq!(remote.read_some(data.len() as u64, &mut tail).unwrap(), 0);
    }

    #[test]
    fn the_cache_keeps_the_most_recently_used_blocks() {
        let data: Vec<u8> = (0..100u8).collect();
        let cache = BlockCache::new(10, 2);
        let fetch = |r: Range<u64>| Ok(Bytes::copy_from_slice(&data[r.start as usize..(r.end as usize).min(100)]));
        let mut b = [0u8; 3];
        for (at, fetches) in [(0, 1), (11, 2), (1, 2), (21, 3), (2, 3), (12, 4)] {
            cache.read(at..at + 3, &mut b, &fetch).unwrap();
            assert_eq!(b[..], data[at as usize..at as usize + 3]);
            assert_eq!(cache.fetches.load(Ordering::Relaxed), fetches, "after a read at {at}");
        }
    }

    /// A file of several parts arrives whole (the part size raised for a file of too many parts), one of
    /// a part or less by one PUT; a cancelled upload leaves nothing at the key.
    #[test]
    fn uploads_deliver_the_whole_file_or_nothing() {
        let rt = runtime().unwrap();
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let dir = tempfile::tempdir().unwrap();
        let data: Vec<u8> = (0..(7 * MIN_PART_LEN / 2) as usize).map(|i| (i % 253) as u8).collect();
        let file = dir.path().join("out.cbf");
        std::fs::write(&file, &data).unwrap();
        for (key, part_len) in [("a.cbf", MIN_PART_LEN), ("b.cbf", 1), ("c.cbf", PART_LEN)] {
            let location = ObjectPath::from(key);
            let sent = upload_to("memory:///x", store.clone(), &location, &file, part_len, None).unwrap();
            assert_eq!(sent, data.len() as u64);
            let got = rt.block_on(async { store.get(&location).await?.bytes().await }).unwrap();
            assert!(got[..] == data[..], "{key} holds the file");
        }
        let location = ObjectPath::from("d.cbf");
        let e = upload_to("memory:///d.cbf", store.clone(), &location, &file, MIN_PART_LEN, Some(|| true)).unwrap_err();
        let crate::ErrorKind::Io { source, .. } = e.kind() else { panic!("not an I/O error: {e}") };
        assert_eq!(source.kind(), std::io::ErrorKind::Interrupted);
        let head = rt.block_on(store.head(&location));
        assert!(matches!(head, Err(object_store::Error::NotFound { .. })), "{head:?}");
    }

    /// A transfer that never ends is given up once `cancel` says so; one that ends is awaited.
    #[test]
    fn a_cancelled_transfer_is_given_up_while_it_waits() {
        static STOP: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
        let rt = runtime().unwrap();
        let cancel: Option<fn() -> bool> = Some(|| STOP.load(Ordering::SeqCst));
        assert_eq!(rt.block_on(unless_cancelled(async { 7 }, cancel)).unwrap(), 7);
        let stopper = std::thread::spawn(|| {
            std::thread::sleep(Duration::from_millis(120));
            STOP.store(true, Ordering::SeqCst);
        });
        let e = rt.block_on(unless_cancelled(std::future::pending::<()>(), cancel)).unwrap_err();
        stopper.join().unwrap();
        let crate::ErrorKind::Io { source, .. } = e.kind() else { panic!("not an I/O error: {e}") };
        assert_eq!(source.kind(), std::io::ErrorKind::Interrupted);
    }

    #[test]
    fn a_missing_object_is_a_not_found_error_naming_the_url() {
        let (_, store, _) = object(10);
        let e = Remote::with_store("s3://b/missing.ctf", store, ObjectPath::from("missing.ctf")).unwrap_err();
        let crate::ErrorKind::Io { source, .. } = e.kind() else { panic!("not an I/O error: {e}") };
        assert_eq!(source.kind(), std::io::ErrorKind::NotFound);
        assert!(e.to_string().contains("s3://b/missing.ctf"), "{e}");
        assert!(is_url(std::path::Path::new("S3://b/k")) && is_url(std::path::Path::new("https://h/p")));
        assert!(!is_url(std::path::Path::new("data/s3:/x")));
    }

    /// Each scheme gets its store, and the key is the URL's path within the bucket.
    #[test]
    fn urls_name_their_store_and_key() {
        let cases = [
            ("s3://bucket/dir/a.cbf", "AmazonS3", "dir/a.cbf"),
            ("s3a://bucket/a.cbf", "AmazonS3", "a.cbf"),
            ("gs://bucket/dir/a b.cbf", "GoogleCloudStorage", "dir/a b.cbf"),
            ("abfss://data@account.dfs.core.windows.net/dir/a.cbf", "MicrosoftAzure", "dir/a.cbf"),
            ("https://example.com/files/a%20b.cbf", "HttpStore", "files/a b.cbf"),
        ];
        for (url, store, key) in cases {
            let (s, location) = store_for(url).unwrap_or_else(|e| panic!("{url}: {e}"));
            assert!(format!("{s}").starts_with(store), "{url}: {s}");
            assert_eq!(location.as_ref(), key, "{url}");
            assert!(is_url(std::path::Path::new(url)));
        }
        // az:// names a container only: the account comes from AZURE_STORAGE_ACCOUNT_NAME (or is Azurite's).
        if ["AZURE_STORAGE_ACCOUNT_NAME", "AZURE_STORAGE_USE_EMULATOR"].iter().all(|v| std::env::var_os(v).is_none()) {
            let e = store_for("az://container/a.cbf").expect_err("no account");
            assert!(e.is_io() && e.to_string().contains("az://container/a.cbf"), "{e}");
        }
        assert!(store_for("s3://").is_err());
    }
}
