#![no_main]

libfuzzer_sys::fuzz_target!(init: strata_fuzz::init(), |data: &[u8]| {
    strata_fuzz::run(strata_fuzz::targets::pax_leaf, data);
});
