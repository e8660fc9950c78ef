// The objects of libfencelock-fence.so come from the static fence library, linked in whole
// (cmake/FencelockPackage.cmake); a shared library needs one source of its own.
