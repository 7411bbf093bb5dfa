//! Finishing output files: written to a temporary file in the target folder, then renamed, so an
//! interrupted write never leaves a file that looks complete.

use crate::Error;
use std::path::Path;

/// Makes the temporary file an ordinary file (readable by others, like a freshly created one; the
/// temporary file was created private), syncs it to disk and renames it to `path`.
pub(crate) fn persist(tmp: tempfile::NamedTempFile, path: &Path) -> Result<(), Error> {
    let shown = path.display();
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
