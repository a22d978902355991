#!/usr/bin/perl
# A listed script whose interpreter is not listed: the kernel opens perl for execution
# too, so running this fails with EACCES unless /usr/bin/perl is allowed as well.
print "tool.pl ran\n";
