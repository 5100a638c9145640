//! `cellrate::fuzzing::uds_authority` under libFuzzer.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| cellrate::fuzzing::uds_authority(data));
