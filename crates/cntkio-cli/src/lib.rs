//! cntkio CLI
pub fn run() {}
