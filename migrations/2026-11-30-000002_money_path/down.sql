DROP TABLE dead_letters;
DROP TABLE antifraud_decisions;
