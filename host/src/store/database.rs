//! The server's SQLite database: tenants, the op journal and jobs, one file under `--data`.

use std::path::Path;

use rusqlite::Connection;

/// The database file under the server's `--data` folder.
pub const DATABASE_FILE: &str = "opentinker.sqlite3";

/// A connection to the server database in `data`: WAL (readers never wait for the writer),
/// every commit fsynced.
pub fn open_database(data: &Path) -> rusqlite::Result<Connection> {
    let db = Connection::open(data.join(DATABASE_FILE))?;
    db.pragma_update(None, "journal_mode", "WAL")?;
    db.pragma_update(None, "synchronous", "FULL")?;
    db.busy_timeout(std::time::Duration::from_secs(5))?;
    Ok(db)
}
