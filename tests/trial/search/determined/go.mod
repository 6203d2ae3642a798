module seqref

go 1.19
