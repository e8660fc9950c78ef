// The objects of libfencelock-client.so come from the static lock_client, linked in whole
// (cmake/FencelockPackage.cmake); a shared library needs one source of its own.
