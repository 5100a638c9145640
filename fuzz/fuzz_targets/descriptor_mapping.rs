//! `cellrate::fuzzing::descriptor_mapping` under libFuzzer.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| cellrate::fuzzing::descriptor_mapping(data));
