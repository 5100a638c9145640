//! `cellrate::fuzzing::check` under libFuzzer.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| cellrate::fuzzing::check(data));
