//! Reading CNTK BrainScript config files (`.cntk`).

pub mod brainscript;
