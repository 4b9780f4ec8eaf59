# a source edit that changes no program
