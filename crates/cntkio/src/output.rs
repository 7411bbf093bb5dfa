//! Finishing output files: written to a temporary file in the target folder, then renamed, so an
//! interrupted write never leaves a file that looks complete.
//!
//! **Temporary files** ([`temporary`]): every file cntkio writes (a converted file, an index cache) is
//! first written to `.<name>.<6 random characters>.tmp` in the folder of its target `<name>`, a hidden
//! file that is renamed over the target once it is complete and synced. A failed write removes it; a
//! process killed outright (`SIGKILL`, a power cut) cannot, and leaves it behind: such a file is never
//! complete, and can be deleted.
//!
//! **Outputs to an object store** (`s3://…` and the other URLs [`remote`](crate::remote) opens): the
//! temporary file is made in the directory `CNTKIO_TMPDIR` names, else in the system's temporary directory
//! (`TMPDIR`), under the same kind of name, and [`persist`] uploads it (a multipart upload completed only
//! at the end, so the object's key shows nothing until the whole file is there) and then removes it.

use crate::Error;
use std::fs::File;
use std::io;
use std::path::Path;

/// The variable naming the directory of the temporary files of outputs to object stores.
const TMPDIR_VAR: &str = "CNTKIO_TMPDIR";

/// The directory of the temporary files of outputs to object stores: `CNTKIO_TMPDIR`, else the system's.
fn object_output_dir() -> std::path::PathBuf {
    std::env::var_os(TMPDIR_VAR)
        .filter(|d| !d.is_empty())
        .map(std::path::PathBuf::from)
        .unwrap_or_else(std::env::temp_dir)
}

/// Creates the temporary file for `path` (see the module documentation), private to the user until
/// [`persist`] gives it the target's permissions.
pub(crate) fn temporary(path: &Path) -> Result<tempfile::NamedTempFile, Error> {
    temporary_noted(path, None)
}

/// [`temporary`], telling `note` each name it is about to create before creating it (a name already
/// taken is noted again with the next one tried), so that a signal handler that removes the noted file
/// leaves nothing behind whenever it runs: before the file exists, it removes nothing (and the file is
/// never made, the process ends), after, it removes the file.
pub(crate) fn temporary_noted(path: &Path, note: Option<fn(&Path)>) -> Result<tempfile::NamedTempFile, Error> {
    let remote_dir;
    let dir = if crate::remote::is_url(path) {
        crate::remote::check_output(&path.to_string_lossy())?;
        remote_dir = object_output_dir();
        remote_dir.as_path()
    } else {
        path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."))
    };
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    tempfile::Builder::new()
        .prefix(&format!(".{name}."))
        .suffix(".tmp")
        .rand_bytes(6)
        .make_in(dir, |p| {
            if let Some(f) = note {
                f(p);
            }
            let mut o = std::fs::OpenOptions::new();
            o.read(true).write(true).create_new(true);
            #[cfg(unix)]
            std::os::unix::fs::OpenOptionsExt::mode(&mut o, 0o600);
            o.open(p)
        })
        .map_err(|e| Error::io(format!("cannot create a temporary file beside {}", path.display()), e))
}

/// What a failed write of an output says: the output's path and, when its file system is full, the
/// space that was free on it when writing began (a full disk is the common cause, and the number says
/// how much room the output found).
#[derive(Debug, Clone)]
pub(crate) struct Target {
    shown: String,
    /// Bytes free on the file system (for an unprivileged user) when the temporary file was created;
    /// `None` where the system cannot tell.
    free_bytes: Option<u64>,
}

impl Target {
    /// The target `path`, written through its temporary file `tmp`.
    pub(crate) fn new(path: &Path, tmp: &File) -> Target {
        Target { shown: path.display().to_string(), free_bytes: free_bytes(tmp) }
    }

    /// The error for a failed write (`e`) of the output.
    pub(crate) fn error(&self, e: io::Error) -> Error {
        let shown = &self.shown;
        let full = matches!(e.kind(), io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded);
        let op = match self.free_bytes {
            Some(free) if full => {
                format!("cannot write {shown}: its file system is full ({} free when writing began)", size_text(free))
            }
            None if full => format!("cannot write {shown}: its file system is full"),
            _ => format!("cannot write {shown}"),
        };
        Error::io(op, e)
    }
}

/// Bytes free for an unprivileged user on the file system holding `file`.
pub(crate) fn free_bytes(file: &File) -> Option<u64> {
    #[cfg(target_os = "linux")]
    {
        let s = rustix::fs::fstatvfs(file).ok()?;
        Some(s.f_bavail.saturating_mul(s.f_frsize))
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = file;
        None
    }
}

/// `n` bytes for a reader: `512 bytes`, `1.5 KiB`, `2.0 MiB`, `3.1 GiB`.
fn size_text(n: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if n < 1024 {
        return format!("{n} bytes");
    }
    let mut v = n as f64 / 1024.0;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:.1} {}", UNITS[unit])
}

/// Makes the temporary file an ordinary file (readable by others, like a freshly created one; the
/// temporary file was created private), syncs it to disk and renames it to `path`. An object store's
/// `path` gets the file by an upload instead (`cancel` asked between its parts), and the file is removed.
pub(crate) fn persist(tmp: tempfile::NamedTempFile, path: &Path, cancel: Option<fn() -> bool>) -> Result<(), Error> {
    let shown = path.display();
    if let Some(url) = path.to_str().filter(|_| crate::remote::is_url(path)) {
        crate::remote::upload(tmp.path(), url, cancel)?;
        return tmp.close().map_err(|e| Error::io(format!("cannot remove the temporary file of {shown}"), e));
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        // An existing target keeps its mode; a new one gets rw-r--r--.
        let mode = std::fs::metadata(path).map(|m| m.permissions().mode() & 0o7777).unwrap_or(0o644);
        std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(mode))
            .map_err(|e| Error::io(format!("cannot set the permissions of {shown}"), e))?;
    }
    tmp.as_file().sync_all().map_err(|e| Error::io(format!("cannot sync {shown}"), e))?;
    tmp.persist(path).map_err(|e| Error::io(format!("cannot rename the temporary file to {shown}"), e.error))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_as_units() {
        let cases =
            [(0, "0 bytes"), (1023, "1023 bytes"), (1536, "1.5 KiB"), (2 << 20, "2.0 MiB"), (5 << 30, "5.0 GiB")];
        for (n, text) in cases {
            assert_eq!(size_text(n), text);
        }
    }

    /// Temporary files are hidden, beside their target, and named after it.
    #[test]
    fn temporary_files_are_named_after_their_target() {
        let dir = tempfile::tempdir().unwrap();
        let tmp = temporary(&dir.path().join("out.cbf")).unwrap();
        assert_eq!(tmp.path().parent(), Some(dir.path()));
        let name = tmp.path().file_name().unwrap().to_str().unwrap();
        let random = name.strip_prefix(".out.cbf.").and_then(|r| r.strip_suffix(".tmp"));
        assert_eq!(random.map(str::len), Some(6), "{name}");
    }

    /// An object's temporary file is in the temporary directory, named after the object.
    #[test]
    fn temporary_files_of_objects_are_in_the_temporary_directory() {
        let tmp = temporary(Path::new("s3://bucket/dir/out.cbf")).unwrap();
        assert_eq!(tmp.path().parent(), Some(object_output_dir().as_path()));
        let name = tmp.path().file_name().unwrap().to_str().unwrap();
        assert!(name.starts_with(".out.cbf.") && name.ends_with(".tmp"), "{name}");
    }

    /// The name is noted before the file exists, and the file noted last is the one made, private to the
    /// user.
    #[test]
    fn the_temporary_file_is_noted_before_it_is_made() {
        use std::sync::Mutex;
        static NOTED: Mutex<Vec<(std::path::PathBuf, bool)>> = Mutex::new(Vec::new());
        fn note(p: &Path) {
            NOTED.lock().unwrap().push((p.to_path_buf(), p.exists()));
        }
        let dir = tempfile::tempdir().unwrap();
        let tmp = temporary_noted(&dir.path().join("out.cbf"), Some(note)).unwrap();
        let noted = NOTED.lock().unwrap().clone();
        assert_eq!(noted.last().map(|(p, existed)| (p.as_path(), *existed)), Some((tmp.path(), false)));
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            assert_eq!(tmp.as_file().metadata().unwrap().permissions().mode() & 0o777, 0o600);
        }
    }

    /// A full file system is said to be full, with the output's path and the space it had; other errors
    /// name the path.
    #[test]
    fn write_errors_name_the_output_and_the_free_space() {
        let t = Target { shown: "d/out.cbf".into(), free_bytes: Some(2 << 20) };
        let e = t.error(io::Error::from(io::ErrorKind::StorageFull));
        assert!(e.is_io());
        assert!(
            e.kind()
                .to_string()
                .starts_with("cannot write d/out.cbf: its file system is full (2.0 MiB free when writing began): "),
            "{e}"
        );
        let e = t.error(io::Error::from(io::ErrorKind::PermissionDenied));
        assert!(e.kind().to_string().starts_with("cannot write d/out.cbf: "), "{e}");
        assert!(!e.kind().to_string().contains("full"), "{e}");
        let t = Target { free_bytes: None, ..t };
        let e = t.error(io::Error::from(io::ErrorKind::StorageFull));
        assert!(e.kind().to_string().starts_with("cannot write d/out.cbf: its file system is full: "), "{e}");
    }
}
