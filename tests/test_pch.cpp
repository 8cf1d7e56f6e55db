// The source of strata_test_pch (tests/CMakeLists.txt): the target exists to build the tests'
// precompiled header once; this file gives it something to compile.
namespace strata {}
