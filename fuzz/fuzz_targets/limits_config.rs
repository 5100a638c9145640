//! `cellrate::fuzzing::limits_config` under libFuzzer.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| cellrate::fuzzing::limits_config(data));
